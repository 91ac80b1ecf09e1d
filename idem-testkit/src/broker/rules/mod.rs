//! The broker rules, one public async fn each, grouped by capability, generic over the
//! [`Broker`](super::Broker) and the database ([`Backend`](crate::Backend)). Each makes its own
//! input and database ([`harness::with`](super::harness::with)), asserts the database against
//! the exactly-once oracle and the broker's state, and deletes both, also when it fails.
//! [`broker_suite!`](crate::broker_suite) runs them all.

pub mod crash;
pub mod dead_letter;
pub mod exactly_once;
pub mod health;
pub mod lag;
pub mod max_deliveries;
pub mod outbox;
pub mod recovery;
pub mod settle_after_commit;
pub mod shutdown;

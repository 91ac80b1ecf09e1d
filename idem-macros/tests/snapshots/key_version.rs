// Input:
// #[idempotent(key = "msg.account_id", version = "msg.seq", scope = "ledger::balance")]
// pub async fn on_balance(
//     tx: &mut Tx<'_, Postgres>,
//     msg: &BalanceChanged,
// ) -> Result<(), sqlx::Error> {
//     sqlx::query("UPDATE accounts SET balance = $1 WHERE id = $2")
//         .bind(msg.balance)
//         .bind(msg.account_id)
//         .execute(&mut **tx)
//         .await?;
//     Ok(())
// }
//
// Expansion:
pub async fn on_balance<'__idem_source, '__idem_tx: '__idem_source>(
    mut tx: impl ::idem::Transact<'__idem_source, '__idem_tx, Postgres>,
    msg: &BalanceChanged,
) -> ::idem::Handled<Result<(), sqlx::Error>> {
    let __idem_claim = ::idem::__private::Claim::new("ledger::balance")
        .key(&(msg.account_id))
        .version(&(msg.seq));
    let ::core::option::Option::Some(__idem_claim) = __idem_claim.gather_in(&mut tx)
    else {
        return ::core::result::Result::Err(::idem::Error::Deferred);
    };
    let (mut __idem_tx, __idem_run) = match __idem_claim.begin(tx).await {
        ::idem::__private::Begun::Run(__idem_tx, __idem_run) => (__idem_tx, __idem_run),
        ::idem::__private::Begun::Done(__idem_done) => return __idem_done,
    };
    let tx: &mut Tx<'_, Postgres> = &mut __idem_tx;
    let __idem_result: Result<(), sqlx::Error> = __idem_run
        .in_span(async move {
            sqlx::query("UPDATE accounts SET balance = $1 WHERE id = $2")
                .bind(msg.balance)
                .bind(msg.account_id)
                .execute(&mut **tx)
                .await?;
            Ok(())
        })
        .await;
    __idem_run.finish(__idem_tx, __idem_result).await
}

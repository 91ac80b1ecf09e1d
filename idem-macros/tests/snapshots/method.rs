// Input:
// #[idempotent(key = "(self.tenant, msg.id)", scope = "billing::charge")]
// /// Charges the order once per payment event.
// pub(crate) async fn charge(
//     &self,
//     tx: &mut Tx<'_, Postgres>,
//     msg: &Paid,
// ) -> anyhow::Result<ChargeId> {
//     let id = self.gateway.charge(msg.amount).await?;
//     Ok(id)
// }
//
// Expansion:
/// Charges the order once per payment event.
pub(crate) async fn charge<'__idem_source, '__idem_tx: '__idem_source>(
    &self,
    mut tx: impl ::idem::Transact<'__idem_source, '__idem_tx, Postgres>,
    msg: &Paid,
) -> ::idem::Handled<anyhow::Result<ChargeId>> {
    let __idem_claim = ::idem::__private::Claim::new("billing::charge")
        .key(&((self.tenant, msg.id)));
    let ::core::option::Option::Some(__idem_claim) = __idem_claim.gather_in(&mut tx)
    else {
        return ::core::result::Result::Err(::idem::Error::Deferred);
    };
    let (mut __idem_tx, __idem_run) = match __idem_claim.begin(tx).await {
        ::idem::__private::Begun::Run(__idem_tx, __idem_run) => (__idem_tx, __idem_run),
        ::idem::__private::Begun::Done(__idem_done) => return __idem_done,
    };
    let tx: &mut Tx<'_, Postgres> = &mut __idem_tx;
    let __idem_result: anyhow::Result<ChargeId> = __idem_run
        .in_span(async move {
            let id = self.gateway.charge(msg.amount).await?;
            Ok(id)
        })
        .await;
    __idem_run.finish(__idem_tx, __idem_result).await
}

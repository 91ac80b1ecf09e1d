// Input:
// #[idempotent(
//     key = "msg.id",
//     scope = "payments::charge",
//     mode = "lease",
//     lease = "45s",
//     retention = "14d"
// )]
// async fn charge(
//     tx: &mut Tx<'_, Postgres>,
//     msg: &ChargeRequested,
//     ctx: &Context,
//     provider: &Provider,
// ) -> Result<String, Error> {
//     let id = provider.charge(&ctx.derive("charge"), msg.amount).await?;
//     Ok(id)
// }
//
// Expansion:
async fn charge<'__idem_source, '__idem_tx: '__idem_source>(
    tx: impl ::idem::LeaseTransact<'__idem_source, Postgres>,
    msg: &ChargeRequested,
    provider: &Provider,
) -> ::idem::Handled<Result<String, Error>> {
    let __idem_claim = ::idem::__private::Claim::new("payments::charge")
        .key(&(msg.id))
        .retention(::idem::__private::Duration::from_millis(1209600000u64))
        .lease(::idem::__private::Duration::from_millis(45000u64));
    let __idem_claim = __idem_claim.lease_mode();
    let (mut __idem_tx, __idem_run) = match __idem_claim.begin_lease(tx).await {
        ::idem::__private::Begun::Run(__idem_tx, __idem_run) => (__idem_tx, __idem_run),
        ::idem::__private::Begun::Done(__idem_done) => return __idem_done,
    };
    let tx: &mut Tx<'_, Postgres> = &mut __idem_tx;
    let ctx: &Context = __idem_run.context();
    let __idem_result: Result<String, Error> = __idem_run
        .in_span(async move {
            let id = provider.charge(&ctx.derive("charge"), msg.amount).await?;
            Ok(id)
        })
        .await;
    __idem_run.finish(__idem_tx, __idem_result).await
}

// Input:
// #[idempotent(key = "msg.id", verison = "msg.version")]
// async fn on_paid(tx: &mut Tx<'_, Sqlite>, msg: &Paid) -> Result<(), sqlx::Error> {
//     Ok(())
// }
//
// Expansion:
async fn on_paid<'__idem_source, '__idem_tx: '__idem_source>(
    mut tx: impl ::idem::Transact<'__idem_source, '__idem_tx, Sqlite>,
    msg: &Paid,
) -> ::idem::Handled<Result<(), sqlx::Error>> {
    let __idem_claim = ::idem::__private::Claim::new(
            ::core::concat!(::core::module_path!(), "::", "on_paid"),
        )
        .key(&(msg.id));
    let ::core::option::Option::Some(__idem_claim) = __idem_claim.gather_in(&mut tx)
    else {
        return ::core::result::Result::Err(::idem::Error::Deferred);
    };
    let (mut __idem_tx, __idem_run) = match __idem_claim.begin(tx).await {
        ::idem::__private::Begun::Run(__idem_tx, __idem_run) => (__idem_tx, __idem_run),
        ::idem::__private::Begun::Done(__idem_done) => return __idem_done,
    };
    let tx: &mut Tx<'_, Sqlite> = &mut __idem_tx;
    let __idem_result: Result<(), sqlx::Error> = __idem_run
        .in_span(async move { Ok(()) })
        .await;
    __idem_run.finish(__idem_tx, __idem_result).await
}
::core::compile_error! {
    "unknown option `verison`: did you mean `version`?"
}

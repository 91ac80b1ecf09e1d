// Input:
// #[idempotent(key = msg.id(), version = msg.version(), crate = "my_platform::idem")]
// async fn on_event<DB, M>(tx: &mut Tx<'_, DB>, msg: &M) -> Result<impl Display, E>
// where
//     DB: Store,
//     M: Event + Sync,
// {
//     Ok(msg.describe())
// }
//
// Expansion:
async fn on_event<'__idem_source, '__idem_tx: '__idem_source, DB, M>(
    mut tx: impl my_platform::idem::Transact<'__idem_source, '__idem_tx, DB>,
    msg: &M,
) -> my_platform::idem::Handled<Result<impl Display, E>>
where
    DB: Store,
    M: Event + Sync,
{
    let __idem_claim = my_platform::idem::__private::Claim::new(
            ::core::concat!(::core::module_path!(), "::", "on_event"),
        )
        .key(&msg.id())
        .version(&msg.version());
    let ::core::option::Option::Some(__idem_claim) = __idem_claim.gather_in(&mut tx)
    else {
        return ::core::result::Result::Err(my_platform::idem::Error::Deferred);
    };
    let (mut __idem_tx, __idem_run) = match __idem_claim.begin(tx).await {
        my_platform::idem::__private::Begun::Run(__idem_tx, __idem_run) => {
            (__idem_tx, __idem_run)
        }
        my_platform::idem::__private::Begun::Done(__idem_done) => return __idem_done,
    };
    let tx: &mut Tx<'_, DB> = &mut __idem_tx;
    let __idem_result: Result<_, E> = __idem_run
        .in_span(async move { Ok(msg.describe()) })
        .await;
    __idem_run.finish(__idem_tx, __idem_result).await
}

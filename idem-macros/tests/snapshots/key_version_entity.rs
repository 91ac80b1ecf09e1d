// Input:
// #[idempotent(
//     key = "msg.id",
//     version = "msg.version",
//     entity = "msg.order_id",
//     scope = "orders::status"
// )]
// async fn on_status_changed(
//     tx: &mut Tx<'_, Sqlite>,
//     msg: &StatusChanged,
// ) -> Result<(), AppError> {
//     sqlx::query("UPDATE orders SET status = ? WHERE id = ?")
//         .bind(&msg.status)
//         .bind(msg.order_id)
//         .execute(&mut **tx)
//         .await?;
//     Ok(())
// }
//
// Expansion:
async fn on_status_changed<'__idem_source, '__idem_tx: '__idem_source>(
    mut tx: impl ::idem::Transact<'__idem_source, '__idem_tx, Sqlite>,
    msg: &StatusChanged,
) -> ::idem::Handled<Result<(), AppError>> {
    let __idem_claim = ::idem::__private::Claim::new("orders::status")
        .key(&(msg.id))
        .version(&(msg.version))
        .entity(&(msg.order_id));
    let ::core::option::Option::Some(__idem_claim) = __idem_claim.gather_in(&mut tx)
    else {
        return ::core::result::Result::Err(::idem::Error::Deferred);
    };
    let (mut __idem_tx, __idem_run) = match __idem_claim.begin(tx).await {
        ::idem::__private::Begun::Run(__idem_tx, __idem_run) => (__idem_tx, __idem_run),
        ::idem::__private::Begun::Done(__idem_done) => return __idem_done,
    };
    let tx: &mut Tx<'_, Sqlite> = &mut __idem_tx;
    let __idem_result: Result<(), AppError> = __idem_run
        .in_span(async move {
            sqlx::query("UPDATE orders SET status = ? WHERE id = ?")
                .bind(&msg.status)
                .bind(msg.order_id)
                .execute(&mut **tx)
                .await?;
            Ok(())
        })
        .await;
    __idem_run.finish(__idem_tx, __idem_result).await
}

// Input:
// #[idempotent(
//     key = "msg.event_id",
//     version = "msg.version",
//     entity = "msg.order_id",
//     scope = "orders::on_status"
// )]
// async fn on_status(
//     tx: &mut Tx<'_, Sqlite>,
//     msg: &StatusChanged,
// ) -> Result<(), sqlx::Error> {
//     sqlx::query(
//             "INSERT INTO orders (id, status, version) VALUES (?1, ?2, ?3) \
//          ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version",
//         )
//         .bind(msg.order_id)
//         .bind(msg.status)
//         .bind(msg.version)
//         .execute(&mut **tx)
//         .await?;
//     Ok(())
// }
//
// Expansion:
async fn on_status<'__idem_source, '__idem_tx: '__idem_source>(
    mut tx: impl ::idem::Transact<'__idem_source, '__idem_tx, Sqlite>,
    msg: &StatusChanged,
) -> ::idem::Handled<Result<(), sqlx::Error>> {
    let __idem_claim = ::idem::__private::Claim::new("orders::on_status")
        .key(&(msg.event_id))
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
    let __idem_result: Result<(), sqlx::Error> = __idem_run
        .in_span(async move {
            sqlx::query(
                    "INSERT INTO orders (id, status, version) VALUES (?1, ?2, ?3) \
         ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version",
                )
                .bind(msg.order_id)
                .bind(msg.status)
                .bind(msg.version)
                .execute(&mut **tx)
                .await?;
            Ok(())
        })
        .await;
    __idem_run.finish(__idem_tx, __idem_result).await
}

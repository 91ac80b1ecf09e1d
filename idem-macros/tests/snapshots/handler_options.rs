// Input:
// #[idempotent(
//     key = "msg.id",
//     fingerprint = "msg.body",
//     replay = true,
//     max_attempts = 5,
//     scope = "billing::invoice"
// )]
// async fn invoice(
//     tx: &mut Tx<'_, Postgres>,
//     msg: &InvoiceRequested,
// ) -> Result<Invoice, Error> {
//     let invoice = Invoice::insert(tx, msg).await?;
//     Ok(invoice)
// }
//
// Expansion:
async fn invoice<'__idem_source, '__idem_tx: '__idem_source>(
    mut tx: impl ::idem::PooledTransact<'__idem_source, '__idem_tx, Postgres>,
    msg: &InvoiceRequested,
) -> ::idem::Handled<Result<Invoice, Error>> {
    let __idem_claim = ::idem::__private::Claim::new("billing::invoice").key(&(msg.id));
    let __idem_claim = __idem_claim.fingerprint(&(msg.body));
    let __idem_claim = __idem_claim.replay();
    let __idem_claim = __idem_claim.max_attempts(5u32);
    let ::core::option::Option::Some(__idem_claim) = __idem_claim.gather_in(&mut tx)
    else {
        return ::core::result::Result::Err(::idem::Error::Deferred);
    };
    let (mut __idem_tx, mut __idem_run) = match __idem_claim.begin_counted(tx).await {
        ::idem::__private::Begun::Run(__idem_tx, __idem_run) => (__idem_tx, __idem_run),
        ::idem::__private::Begun::Done(__idem_done) => {
            return ::idem::__private::replayed::<Result<Invoice, Error>>(__idem_done);
        }
    };
    let tx: &mut Tx<'_, Postgres> = &mut __idem_tx;
    let __idem_caught = ::idem::__private::catch_unwind(
            __idem_run
                .in_span(async move {
                    let invoice = Invoice::insert(tx, msg).await?;
                    Ok(invoice)
                }),
        )
        .await;
    let __idem_result: Result<Invoice, Error> = match __idem_caught {
        ::core::result::Result::Ok(__idem_result) => __idem_result,
        ::core::result::Result::Err(__idem_caught) => {
            return __idem_run.panicked(__idem_tx, __idem_caught).await;
        }
    };
    __idem_run.encode(&__idem_result);
    if let ::core::result::Result::Err(__idem_err) = &__idem_result {
        use ::idem::__private::{DisplayText as _, NameText as _};
        __idem_run.failed_with((&&::idem::__private::ErrorText(__idem_err)).text());
    }
    __idem_run.finish(__idem_tx, __idem_result).await
}

//! Code generation for `#[idempotent]`: thin glue around `idem::__private::Claim`.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens as _};
use syn::{FnArg, Ident, ItemFn, Pat, Path};

use crate::args::{Args, Errors};
use crate::handler::Handler;

/// Entry point: expands the attribute, or emits the fn unchanged beside the errors, so that one
/// mistake does not turn into "cannot find function" at every call site.
pub(crate) fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let item_fn: ItemFn = match syn::parse2(item.clone()) {
        Ok(item_fn) => item_fn,
        Err(_) => {
            let err = syn::Error::new(
                Span::call_site(),
                "`#[idempotent]` goes on an `async fn` (a free fn or a method with a body)",
            );
            return with_error(item, err);
        }
    };
    let original = item_fn.to_token_stream();
    match plan(args, item_fn) {
        Ok((args, handler)) => generate(&args, handler),
        Err(err) => with_error(original, err),
    }
}

fn with_error(mut tokens: TokenStream, err: syn::Error) -> TokenStream {
    tokens.extend(err.into_compile_error());
    tokens
}

/// Parses the options and the fn, and checks them against each other, reporting every
/// independent mistake at once.
fn plan(args: TokenStream, item: ItemFn) -> syn::Result<(Args, Handler)> {
    let args = Args::parse(args);
    let handler = Handler::analyze(item);
    let (args, handler) = match (args, handler) {
        (Ok(args), Ok(handler)) => (args, handler),
        (Err(mut a), Err(h)) => {
            a.combine(h);
            return Err(a);
        }
        (Err(e), _) | (_, Err(e)) => return Err(e),
    };
    let mut errors = Errors::default();
    handler.check_expr("key", &args.key, &mut errors);
    for (name, value) in [("version", &args.version), ("entity", &args.entity)] {
        if let Some(value) = value {
            handler.check_expr(name, value, &mut errors);
        }
    }
    errors.finish((args, handler))
}

// Input:
//     #[idempotent(key = "msg.id", version = "msg.version")]
//     async fn on_paid(tx: &mut Tx<'_, Sqlite>, msg: &Paid) -> Result<(), E> { BODY }
// Output:
//     async fn on_paid(tx: impl ::idem::Source<'_, Sqlite>, msg: &Paid) -> ::idem::Handled<Result<(), E>> {
//         let claim = Claim::new(SCOPE).key(&(msg.id)).version(&(msg.version));
//         let (mut tx_, run) = match claim.begin(tx).await { Run(tx, run) => .., Done(done) => return done };
//         let tx: &mut Tx<'_, Sqlite> = &mut tx_;
//         let result: Result<(), E> = run.instrument(async move BODY).await;
//         run.finish(tx_, result).await
//     }
fn generate(args: &Args, handler: Handler) -> TokenStream {
    let krate: Path = args
        .krate
        .clone()
        .unwrap_or_else(|| syn::parse_quote!(::idem));
    let private = quote!(#krate::__private);
    // Internal names resolve at the macro's definition site: the body can neither see nor shadow them.
    let name = |n: &str| Ident::new(n, Span::mixed_site());
    let (claim, tx_var, run, result, done) = (
        name("__idem_claim"),
        name("__idem_tx"),
        name("__idem_run"),
        name("__idem_result"),
        name("__idem_done"),
    );

    let Handler {
        mut item,
        tx_index,
        db,
        ret,
        ..
    } = handler;
    let fn_name = item.sig.ident.to_string();
    let scope = match &args.scope {
        Some(scope) => scope.to_token_stream(),
        None => quote!(::core::concat!(::core::module_path!(), "::", #fn_name)),
    };

    // The transaction parameter becomes a source: a pool, a transaction or a connection.
    let FnArg::Typed(tx_param) = &mut item.sig.inputs[tx_index] else {
        unreachable!("Handler::analyze found a typed transaction parameter")
    };
    let (tx_pat, tx_ty) = (tx_param.pat.clone(), tx_param.ty.clone());
    let source = match &*tx_pat {
        Pat::Ident(pat) if pat.subpat.is_none() => pat.ident.clone(),
        _ => format_ident!("__idem_source", span = Span::mixed_site()),
    };
    *tx_param.pat = syn::parse_quote!(#source);
    *tx_param.ty = syn::parse_quote!(impl #krate::Source<'_, #db>);
    item.sig.output = syn::parse_quote!(-> #krate::Handled<#ret>);

    let key = spanned_expr(&args.key.expr);
    let mut builder = quote!(#private::Claim::new(#scope).key(&(#key)));
    if let Some(version) = &args.version {
        let version = spanned_expr(&version.expr);
        builder.extend(quote!(.version(&(#version))));
    }
    if let Some(entity) = &args.entity {
        let entity = spanned_expr(&entity.expr);
        builder.extend(quote!(.entity(&(#entity))));
    }

    let body = &item.block;
    let block = quote! {{
        let #claim = #builder;
        let (mut #tx_var, #run) = match #claim.begin(#source).await {
            #private::Begun::Run(tx, run) => (tx, run),
            #private::Begun::Done(#done) => return #done,
        };
        let #tx_pat: #tx_ty = &mut #tx_var;
        let #result: #ret = #run.instrument(async move #body).await;
        #run.finish(#tx_var, #result).await
    }};
    item.block = syn::parse2(block).expect("generated block parses");
    item.into_token_stream()
}

/// The user's expression, re-spanned so type errors in it point at what the user wrote.
fn spanned_expr(expr: &syn::Expr) -> TokenStream {
    let span = syn::spanned::Spanned::span(expr);
    quote_spanned!(span=> #expr)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(args: TokenStream, item: TokenStream) -> String {
        let out = idempotent(args, item);
        prettyplease::unparse(&syn::parse2(out).expect("expansion is a file"))
    }

    #[test]
    fn key_only_handler() {
        let out = expand(
            quote!(key = "msg.id"),
            quote!(
                async fn on_paid(tx: &mut Tx<'_, Sqlite>, msg: &Paid) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(out.contains("tx: impl ::idem::Source<'_, Sqlite>"), "{out}");
        assert!(out.contains("-> ::idem::Handled<Result<(), E>>"), "{out}");
        assert!(out.contains(".key(&(msg.id))"), "{out}");
        assert!(!out.contains(".version("), "{out}");
        assert!(out.contains("::core::module_path!()"), "{out}");
    }

    #[test]
    fn errors_keep_the_original_fn() {
        let out = idempotent(
            quote!(version = "msg.v"),
            quote!(
                async fn h(tx: &mut Tx<'_, Sqlite>) -> R {
                    x
                }
            ),
        );
        let text = out.to_string();
        assert!(text.contains("async fn h"), "{text}");
        assert!(text.contains("compile_error"), "{text}");
        assert!(text.contains("missing `key`"), "{text}");
    }
}

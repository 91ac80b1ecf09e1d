//! Code generation for `#[idempotent]`: thin glue around `idem::__private::Claim`.

use proc_macro2::{Delimiter, Group, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned, ToTokens as _};
use syn::visit_mut::VisitMut;
use syn::{FnArg, Ident, ItemFn, Pat, Path, Type};

use crate::args::{Args, Errors, ValueExpr};
use crate::handler::Handler;

/// Entry point. Every mistake is reported at once, and the fn is always emitted beside the
/// errors, so that one mistake does not become "cannot find function" at each call site:
/// - a mistake in the options: the fn is generated from the options that are valid, so call
///   sites and the body are checked against the signature the user meant;
/// - a mistake in the signature: the fn is emitted as written.
pub(crate) fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let Ok(item_fn) = syn::parse2::<ItemFn>(item.clone()) else {
        errors.push(syn::Error::new(
            Span::call_site(),
            "`#[idempotent]` goes on an `async fn` with a body: a free fn or a method",
        ));
        return errors.emit_into(item);
    };
    let mut args = Args::parse(args, &mut errors);
    let output = match Handler::analyze(item_fn, &mut errors) {
        Ok(handler) => {
            args.key = handler.check("key", args.key.take(), &mut errors);
            args.version = handler.check("version", args.version.take(), &mut errors);
            args.entity = handler.check("entity", args.entity.take(), &mut errors);
            args.fingerprint = handler.check("fingerprint", args.fingerprint.take(), &mut errors);
            generate(&args, handler)
        }
        Err(item_fn) => item_fn.into_token_stream(),
    };
    errors.emit_into(output)
}

// Input:
//     #[idempotent(key = "msg.id", version = "msg.version")]
//     async fn on_paid(tx: &mut Tx<'_, Sqlite>, msg: &Paid) -> Result<(), E> { BODY }
// Output:
//     async fn on_paid(mut tx: impl ::idem::Transact<'__idem_source, '__idem_tx, Sqlite>, msg: &Paid) -> ::idem::Handled<Result<(), E>> {
//         let claim = Claim::new(SCOPE).key(&(msg.id)).version(&(msg.version));
//         let Some(claim) = claim.gather_in(&mut tx) else { return Err(Error::Deferred) };
//         let (mut tx_, run) = match claim.begin(tx).await { Run(tx, run) => .., Done(done) => return done };
//         let tx: &mut Tx<'_, Sqlite> = &mut tx_;
//         let result: Result<(), E> = run.in_span(async move BODY).await;
//         run.finish(tx_, result).await
//     }
// The names this adds resolve at the macro's definition site (`Span::mixed_site`): the body can
// neither see nor shadow them, and every path is absolute.
fn generate(args: &Args, handler: Handler) -> TokenStream {
    let krate: Path = args
        .krate
        .clone()
        .unwrap_or_else(|| syn::parse_quote!(::idem));
    let private = quote!(#krate::__private);
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
        context,
        ..
    } = handler;
    let fn_name = item.sig.ident.to_string();
    let scope = match &args.scope {
        Some(scope) => scope.to_token_stream(),
        None => quote!(::core::concat!(::core::module_path!(), "::", #fn_name)),
    };

    // The transaction parameter becomes a source: a pool or an open transaction.
    let FnArg::Typed(tx_param) = &mut item.sig.inputs[tx_index] else {
        unreachable!("Handler::analyze found a typed transaction parameter")
    };
    let (tx_pat, tx_ty) = (tx_param.pat.clone(), tx_param.ty.clone());
    let source = match &*tx_pat {
        Pat::Ident(pat) if pat.subpat.is_none() => pat.ident.clone(),
        _ => name("__idem_source"),
    };
    // Mutable where a batch may gather the claim from it (`Claim::gather_in`).
    *tx_param.pat = if args.lease_mode {
        syn::parse_quote!(#source)
    } else {
        syn::parse_quote!(mut #source)
    };
    // Two named lifetimes: how long the source is borrowed, and the transaction's own, which
    // outlives the borrow (a batch lends its transaction for one delivery at a time).
    let (borrow, txn) = (
        syn::Lifetime::new("'__idem_source", Span::call_site()),
        syn::Lifetime::new("'__idem_tx", Span::call_site()),
    );
    *tx_param.ty = if args.lease_mode {
        // A lease commits on its own before the body runs: it needs a pool, not a transaction
        // (`LeaseTransact` says so when one is passed).
        syn::parse_quote!(impl #krate::LeaseTransact<#borrow, #db>)
    } else if args.max_attempts.is_some() {
        // Failures are counted in transactions of their own: a pool or a batch, never the
        // caller's transaction (`PooledTransact` says so when one is passed).
        syn::parse_quote!(impl #krate::PooledTransact<#borrow, #txn, #db>)
    } else {
        syn::parse_quote!(impl #krate::Transact<#borrow, #txn, #db>)
    };
    item.sig
        .generics
        .params
        .insert(0, syn::parse_quote!(#txn: #borrow));
    item.sig
        .generics
        .params
        .insert(0, syn::parse_quote!(#borrow));
    // Spanned on the return type: when it is not a `Result`, the errors point at it.
    let (first, last) = span_range(ret.to_token_stream());
    let (handled, close) = (
        respan(quote!(#krate::Handled<), first),
        respan(quote!(>), last),
    );
    item.sig.output = syn::parse_quote!(-> #handled #ret #close);
    let result_arg = Ident::new("__idem_result", Span::mixed_site().located_at(first));

    // The `Context` parameter is filled by the macro, so callers do not pass it.
    let context = context.map(|(at, by_ref)| take_context(&mut item, at, by_ref, &run));

    let builder = claim_builder(args, &scope, &private);
    let capabilities = capability_steps(args, &claim);
    let begin = if args.lease_mode {
        quote!(begin_lease)
    } else if args.max_attempts.is_some() {
        quote!(begin_counted)
    } else {
        quote!(begin)
    };

    // `replay = true`: both places that need `T: Replayable` are spanned on the return type,
    // where the error then points.
    let result_ty = erase_impl_trait(ret);
    // `max_attempts`: the text of the body's error, for `idem_attempts.last_error` (its
    // Display text where it has one, by auto-ref: see `ErrorText`).
    let describe = if args.max_attempts.is_some() {
        let err = name("__idem_err");
        quote! {
            if let ::core::result::Result::Err(#err) = &#result_arg {
                use #private::{DisplayText as _, NameText as _};
                #run.failed_with((&&#private::ErrorText(#err)).text());
            }
        }
    } else {
        quote!()
    };
    let (done_value, encode, mut run_mut) = if args.replay {
        let replayed = respan(quote!(#private::replayed), first);
        let done_arg = Ident::new("__idem_done", Span::mixed_site().located_at(first));
        (
            quote_spanned!(first=> #replayed::<#result_ty>(#done_arg)),
            quote_spanned!(first=> #run.encode(&#result_arg);),
            quote!(mut),
        )
    } else {
        (quote!(#done), quote!(), quote!())
    };
    if args.max_attempts.is_some() {
        run_mut = quote!(mut);
    }
    let (run_arm, done_arm) = (
        quote!(#private::Begun::Run(#tx_var, #run) => (#tx_var, #run)),
        quote!(#private::Begun::Done(#done) => return #done_value),
    );
    let body = &item.block;
    // `max_attempts`: a panic is caught, so that the attempt is counted, and then resumed.
    let run_body = if args.max_attempts.is_some() {
        let caught = name("__idem_caught");
        quote! {
            let #caught = #private::catch_unwind(#run.in_span(async move #body)).await;
            let #result: #result_ty = match #caught {
                ::core::result::Result::Ok(#result) => #result,
                ::core::result::Result::Err(#caught) => return #run.panicked(#tx_var, #caught).await,
            };
        }
    } else {
        quote!(let #result: #result_ty = #run.in_span(async move #body).await;)
    };
    // A batch's first pass keeps the claim and runs nothing: the handler returns before the
    // delivery's future is made. Lease mode is never batched.
    let gather = if args.lease_mode {
        quote!()
    } else {
        quote! {
            let ::core::option::Option::Some(#claim) = #claim.gather_in(&mut #source) else {
                return ::core::result::Result::Err(#krate::Error::Deferred);
            };
        }
    };
    let block = quote! {{
        let #claim = #builder;
        #(#capabilities)*
        #gather
        let (mut #tx_var, #run_mut #run) = match #claim.#begin(#source).await {
            #run_arm,
            #done_arm,
        };
        let #tx_pat: #tx_ty = &mut #tx_var;
        #context
        #run_body
        #encode
        #describe
        #run.finish(#tx_var, #result_arg).await
    }};
    item.block = syn::parse2(block).expect("generated block parses");
    item.into_token_stream()
}

/// `Claim::new(SCOPE).key(..).version(..).entity(..).retention(..).lease(..)`, with what was
/// given.
fn claim_builder(args: &Args, scope: &TokenStream, private: &TokenStream) -> TokenStream {
    let mut builder = quote!(#private::Claim::new(#scope));
    for (method, value) in [
        ("key", &args.key),
        ("version", &args.version),
        ("entity", &args.entity),
    ] {
        if let Some(value) = value {
            builder.extend(claim_call(method, value));
        }
    }
    let duration = |d: std::time::Duration| {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        quote!(#private::Duration::from_millis(#ms))
    };
    if let Some(retention) = args.retention {
        let retention = duration(retention);
        builder.extend(quote!(.retention(#retention)));
    }
    if let Some(lease) = args.lease {
        let lease = duration(lease);
        builder.extend(quote!(.lease(#lease)));
    }
    builder
}

// Input:
//     #[idempotent(key = "msg.id", fingerprint = "msg.body", max_attempts = 5)]
// Output (after the builder's `let`):
//     let __idem_claim = __idem_claim.fingerprint(&(msg.body));
//     let __idem_claim = __idem_claim.max_attempts(5u32);
/// The options that need a capability of the database beyond `Store` (`fingerprint` and
/// `replay`: `Stamps`; `max_attempts`: `Attempts`; `mode = "lease"`: `Leases`), one statement
/// each. The claim's method for the option is bounded by the capability; for an unmet bound of
/// its receiver's type the compiler underlines the receiver, traced back to the context of the
/// method's name. So both, a bare name each (a chain as the receiver would underline the whole
/// attribute), are located at the option, in the macro's own context (`Span::mixed_site`):
/// a database without the capability is one error, at the option.
fn capability_steps(args: &Args, claim: &Ident) -> Vec<TokenStream> {
    let step = |option: Option<Span>, method: &str, call: TokenStream| {
        let at = |name: &str| match option {
            Some(span) => Ident::new(name, claim.span().located_at(span)),
            None => Ident::new(name, claim.span()),
        };
        let (receiver, method) = (at(&claim.to_string()), at(method));
        quote!(let #claim = #receiver.#method #call;)
    };
    let mut steps = Vec::new();
    if let Some(fingerprint) = &args.fingerprint {
        let value = borrowed(fingerprint);
        steps.push(step(args.at.fingerprint, "fingerprint", quote!((#value))));
    }
    if args.replay {
        steps.push(step(args.at.replay, "replay", quote!(())));
    }
    if let Some(n) = args.max_attempts {
        steps.push(step(args.at.max_attempts, "max_attempts", quote!((#n))));
    }
    if args.lease_mode {
        steps.push(step(args.at.mode, "lease_mode", quote!(())));
    }
    steps
}

/// Removes the `Context` parameter at `at` from the signature, and returns the statement that
/// binds it from the claimed delivery instead.
fn take_context(item: &mut ItemFn, at: usize, by_ref: bool, run: &Ident) -> TokenStream {
    let inputs = std::mem::take(&mut item.sig.inputs);
    let mut param = None;
    for (i, arg) in inputs.into_iter().enumerate() {
        match arg {
            FnArg::Typed(typed) if i == at => param = Some(typed),
            arg => item.sig.inputs.push(arg),
        }
    }
    let Some(syn::PatType { pat, ty, .. }) = param else {
        unreachable!("Handler::analyze found a typed context parameter")
    };
    if by_ref {
        quote!(let #pat: #ty = #run.context();)
    } else {
        quote!(let #pat: #ty = ::core::clone::Clone::clone(#run.context());)
    }
}

/// `.key(&msg.id)` or `.key(&(msg.id))`, with every token spanned on the user's expression: when
/// its type is not a `Key` (or a `Version`), the error and its label point at what the user wrote.
fn claim_call(method: &str, value: &ValueExpr) -> TokenStream {
    let (first, _) = span_range(value.expr.to_token_stream());
    let method = Ident::new(method, first);
    let value = borrowed(value);
    quote_spanned!(first=> .#method(#value))
}

/// `&msg.id` or `&(msg.id)`, spanned on the user's expression.
fn borrowed(value: &ValueExpr) -> TokenStream {
    let tokens = value.expr.to_token_stream();
    let (first, last) = span_range(tokens.clone());
    // A string's last token is in another context than its first (see `args::in_string`), and
    // spans of two contexts do not join: the closing parenthesis ends the span there.
    if !value.in_string && binds_tighter_than_borrow(&value.expr) {
        return quote_spanned!(first=> &#tokens);
    }
    let mut parens = Group::new(Delimiter::Parenthesis, tokens);
    parens.set_span(last);
    quote_spanned!(first=> &#parens)
}

/// Whether `&expr` borrows the whole of `expr` without parentheses: paths, fields, calls,
/// indexing, literals and delimited expressions; not `a + b`, `x as T` or `-x`.
fn binds_tighter_than_borrow(expr: &syn::Expr) -> bool {
    use syn::Expr;
    match expr {
        Expr::Path(_)
        | Expr::Lit(_)
        | Expr::Call(_)
        | Expr::Macro(_)
        | Expr::Paren(_)
        | Expr::Tuple(_)
        | Expr::Array(_)
        | Expr::Block(_)
        | Expr::Struct(_) => true,
        Expr::Field(e) => binds_tighter_than_borrow(&e.base),
        Expr::MethodCall(e) => binds_tighter_than_borrow(&e.receiver),
        Expr::Index(e) => binds_tighter_than_borrow(&e.expr),
        Expr::Try(e) => binds_tighter_than_borrow(&e.expr),
        _ => false,
    }
}

/// The spans of the first and last tokens, which the compiler joins to underline the whole.
/// The last one takes the context of the first, as spans of different contexts do not join (a
/// string's field names are in the macro's context, see `args::in_string`).
fn span_range(tokens: TokenStream) -> (Span, Span) {
    let mut trees = tokens.into_iter();
    let first = trees.next().map_or_else(Span::call_site, |t| t.span());
    let last = trees.last().map_or(first, |t| match t {
        TokenTree::Group(group) => group.span_close(),
        other => other.span(),
    });
    (first, last.resolved_at(first))
}

/// `tokens` with every span set to `span`: for absolute paths, which resolve the same anywhere.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|tree| match tree {
            TokenTree::Group(group) => {
                let mut moved = Group::new(group.delimiter(), respan(group.stream(), span));
                moved.set_span(span);
                TokenTree::Group(moved)
            }
            mut other => {
                other.set_span(span);
                other
            }
        })
        .collect()
}

/// The body's return type for a `let`, where `impl Trait` is not allowed: `Result<impl T, E>`
/// becomes `Result<_, E>` (the fn's own return type keeps the `impl Trait`).
fn erase_impl_trait(mut ty: Type) -> Type {
    struct Eraser;
    impl VisitMut for Eraser {
        fn visit_type_mut(&mut self, ty: &mut Type) {
            if let Type::ImplTrait(it) = ty {
                let span = syn::spanned::Spanned::span(&it.impl_token);
                *ty = Type::Infer(syn::TypeInfer {
                    underscore_token: syn::Token![_](span),
                });
            } else {
                syn::visit_mut::visit_type_mut(self, ty);
            }
        }
    }
    Eraser.visit_type_mut(&mut ty);
    ty
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
        assert!(
            out.contains("tx: impl ::idem::Transact<'__idem_source, '__idem_tx, Sqlite>"),
            "{out}"
        );
        assert!(out.contains("-> ::idem::Handled<Result<(), E>>"), "{out}");
        assert!(out.contains(".key(&(msg.id))"), "{out}");
        assert!(!out.contains(".version("), "{out}");
        assert!(out.contains("::core::module_path!()"), "{out}");
        assert!(!out.contains("compile_error"), "{out}");
    }

    #[test]
    fn option_errors_keep_the_generated_signature() {
        let out = expand(
            quote!(version = "msg.v", key = "mgs.id"),
            quote!(
                async fn h(tx: &mut Tx<'_, Sqlite>, msg: &M) -> R {
                    x
                }
            ),
        );
        assert!(
            out.contains("tx: impl ::idem::Transact<'__idem_source, '__idem_tx, Sqlite>"),
            "{out}"
        );
        assert!(out.contains(".version(&(msg.v))"), "{out}");
        // The key that names no parameter is reported once, by the macro, and left out.
        assert!(!out.contains(".key("), "{out}");
        assert!(out.contains("`key` uses `mgs`"), "{out}");
    }

    #[test]
    fn signature_errors_keep_the_fn_as_written() {
        let out = expand(
            quote!(key = "msg.id"),
            quote!(
                fn h(tx: &mut Tx<'_, Sqlite>, msg: &M) -> R {
                    x
                }
            ),
        );
        assert!(
            out.contains("fn h(tx: &mut Tx<'_, Sqlite>, msg: &M) -> R"),
            "{out}"
        );
        assert!(out.contains("needs an `async fn`"), "{out}");
        assert!(!out.contains("Claim"), "{out}");
    }

    #[test]
    fn other_items_are_kept_beside_the_error() {
        let out = expand(
            quote!(key = "msg.id"),
            quote!(
                struct S;
            ),
        );
        assert!(out.contains("struct S;"), "{out}");
        assert!(out.contains("goes on an `async fn`"), "{out}");
    }

    #[test]
    fn impl_trait_is_erased_only_in_the_let() {
        let ty: Type = syn::parse_quote!(Result<Vec<impl Display>, impl Error>);
        let erased = erase_impl_trait(ty);
        assert_eq!(quote!(#erased).to_string(), "Result < Vec < _ > , _ >");
        let out = expand(
            quote!(key = "msg.id"),
            quote!(
                async fn h(tx: &mut Tx<'_, Sqlite>, msg: &M) -> Result<impl Display, E> {
                    Ok(1)
                }
            ),
        );
        assert!(
            out.contains("-> ::idem::Handled<Result<impl Display, E>>"),
            "{out}"
        );
        assert!(out.contains("let __idem_result: Result<_, E>"), "{out}");
    }

    #[test]
    fn claim_calls_borrow_without_needless_parentheses() {
        let call = |expr: syn::Expr| {
            claim_call(
                "key",
                &ValueExpr {
                    expr,
                    in_string: false,
                },
            )
            .to_string()
        };
        assert_eq!(call(syn::parse_quote!(msg.id)), ". key (& msg . id)");
        assert_eq!(call(syn::parse_quote!((a, b.c))), ". key (& (a , b . c))");
        assert_eq!(
            call(syn::parse_quote!(m.id().x[0])),
            ". key (& m . id () . x [0])"
        );
        assert_eq!(call(syn::parse_quote!(a + b)), ". key (& (a + b))");
        assert_eq!(call(syn::parse_quote!(*a.b)), ". key (& (* a . b))");
        assert_eq!(call(syn::parse_quote!((*a).b)), ". key (& (* a) . b)");
        let quoted = ValueExpr {
            expr: syn::parse_quote!(msg.id),
            in_string: true,
        };
        assert_eq!(
            claim_call("key", &quoted).to_string(),
            ". key (& (msg . id))"
        );
    }

    #[test]
    fn claim_calls_borrow_the_whole_expression() {
        let value = ValueExpr {
            expr: syn::parse_quote!(msg.id as u64),
            in_string: false,
        };
        // Wrapped in parentheses: `&msg.id as u64` would be a cast of the reference.
        assert_eq!(
            claim_call("version", &value).to_string(),
            ". version (& (msg . id as u64))"
        );
    }
}

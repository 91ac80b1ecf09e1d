//! The annotated fn, taken apart: its transaction parameter, the database it names, and the
//! names of its other parameters (which the key, version and entity expressions may use).

use syn::spanned::Spanned as _;
use syn::visit::Visit;
use syn::{Expr, FnArg, GenericArgument, Ident, ItemFn, Pat, PathArguments, ReturnType, Type};

use crate::args::{Errors, ValueExpr};

/// The parts of the annotated fn the expansion needs.
pub(crate) struct Handler {
    pub item: ItemFn,
    /// Index in `sig.inputs` of the transaction parameter.
    pub tx_index: usize,
    /// The database type: the last type argument of the transaction type (`Sqlite` in
    /// `&mut Tx<'_, Sqlite>`).
    pub db: Type,
    /// The return type of the body, `Result<T, E>` or an alias.
    pub ret: Type,
    /// Names bound by the parameters other than the transaction (and `self`).
    pub params: Vec<Ident>,
    pub tx_names: Vec<Ident>,
}

const TX_HINT: &str = "the first parameter (after `self`) must be the transaction the body writes through, e.g. `tx: &mut idem::Tx<'_, Sqlite>`";

impl Handler {
    pub(crate) fn analyze(item: ItemFn) -> syn::Result<Handler> {
        let mut errors = Errors::default();
        let sig = &item.sig;
        if sig.asyncness.is_none() {
            errors.push(syn::Error::new(
                sig.fn_token.span,
                "`#[idempotent]` needs an `async fn`: the handler awaits the database\nadd `async` before `fn`",
            ));
        }
        if let Some(constness) = &sig.constness {
            errors.push(syn::Error::new(
                constness.span,
                "`#[idempotent]` cannot be used on a `const fn`",
            ));
        }
        let ret = match &sig.output {
            ReturnType::Type(_, ty) => Some((**ty).clone()),
            ReturnType::Default => {
                errors.push(syn::Error::new(
                    sig.ident.span(),
                    "an `#[idempotent]` handler must return a `Result`: an `Err` rolls the delivery back\nadd `-> Result<(), YourError>`",
                ));
                None
            }
        };

        let tx_index = sig
            .inputs
            .iter()
            .position(|arg| matches!(arg, FnArg::Typed(_)));
        let tx = tx_index.and_then(|i| match &sig.inputs[i] {
            FnArg::Typed(pat) => Some(pat),
            FnArg::Receiver(_) => None,
        });
        let db = match tx {
            None => {
                errors.push(syn::Error::new(
                    sig.paren_token.span.join(),
                    format!("no transaction parameter\n{TX_HINT}"),
                ));
                None
            }
            Some(tx) => match database_of(&tx.ty) {
                Some(db) => Some(db),
                None => {
                    errors.push(syn::Error::new(
                        tx.ty.span(),
                        format!("expected `&mut` to a transaction, found this type\n{TX_HINT}"),
                    ));
                    None
                }
            },
        };

        let mut params = Vec::new();
        let mut tx_names = Vec::new();
        for (i, arg) in sig.inputs.iter().enumerate() {
            if let FnArg::Typed(typed) = arg {
                let names = if Some(i) == tx_index {
                    &mut tx_names
                } else {
                    &mut params
                };
                bound_names(&typed.pat, names);
            }
        }

        let (Some(tx_index), Some(db), Some(ret)) = (tx_index, db, ret) else {
            return Err(errors.finish(()).expect_err("a missing part was reported"));
        };
        errors.finish(Handler {
            item,
            tx_index,
            db,
            ret,
            params,
            tx_names,
        })
    }

    pub(crate) fn name(&self) -> &Ident {
        &self.item.sig.ident
    }

    pub(crate) fn has_receiver(&self) -> bool {
        self.item.sig.receiver().is_some()
    }

    /// Checks that each root name in `value` is a parameter, and not the transaction.
    pub(crate) fn check_expr(&self, option: &str, value: &ValueExpr, errors: &mut Errors) {
        let mut roots = Vec::new();
        roots_of(&value.expr, &mut roots);
        for root in roots {
            let name = root.to_string();
            if name == "self" && self.has_receiver() || self.params.contains(&root) {
                continue;
            }
            let message = if self.tx_names.contains(&root) {
                format!("`{option}` cannot use `{name}`: the transaction is opened after the key is read\nuse a field of the message")
            } else {
                let mut known: Vec<String> = self.params.iter().map(ToString::to_string).collect();
                if self.has_receiver() {
                    known.insert(0, "self".into());
                }
                let known = if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                };
                format!(
                    "`{option}` uses `{name}`, which is not a parameter of `{}`\nparameters it can use: {known}",
                    self.name()
                )
            };
            // A string's tokens all carry the literal's span; a bare expression's, their own.
            errors.push(syn::Error::new(root.span(), message));
        }
    }
}

/// The database of a transaction type: `&mut Tx<'_, DB>` or `&mut sqlx::Transaction<'_, DB>`.
fn database_of(ty: &Type) -> Option<Type> {
    let Type::Reference(reference) = ty else {
        return None;
    };
    reference.mutability?;
    let Type::Path(path) = &*reference.elem else {
        return None;
    };
    let last = path.path.segments.last()?;
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    args.args.iter().rev().find_map(|arg| match arg {
        GenericArgument::Type(db) => Some(db.clone()),
        _ => None,
    })
}

/// Names bound by a parameter pattern: `msg`, `mut msg`, `(a, b)`, `Msg { id, .. }`.
fn bound_names(pat: &Pat, out: &mut Vec<Ident>) {
    struct Names<'a>(&'a mut Vec<Ident>);
    impl<'ast> Visit<'ast> for Names<'_> {
        fn visit_pat_ident(&mut self, pat: &'ast syn::PatIdent) {
            self.0.push(pat.ident.clone());
            syn::visit::visit_pat_ident(self, pat);
        }
    }
    Names(out).visit_pat(pat);
}

/// The names an expression starts from: `msg` in `msg.id.to_string()`, both in `(a.x, b.y)`.
/// Arguments of calls and macros are not followed: they may name anything in scope.
fn roots_of(expr: &Expr, out: &mut Vec<Ident>) {
    match expr {
        Expr::Path(path) if path.qself.is_none() && path.path.leading_colon.is_none() => {
            if let Some(ident) = path.path.get_ident() {
                let name = ident.to_string();
                // Constants and unit structs start with an uppercase letter.
                if name == "self" || name.starts_with(|c: char| c.is_lowercase() || c == '_') {
                    out.push(ident.clone());
                }
            }
        }
        Expr::Field(e) => roots_of(&e.base, out),
        Expr::MethodCall(e) => roots_of(&e.receiver, out),
        Expr::Index(e) => roots_of(&e.expr, out),
        Expr::Reference(e) => roots_of(&e.expr, out),
        Expr::Paren(e) => roots_of(&e.expr, out),
        Expr::Group(e) => roots_of(&e.expr, out),
        Expr::Cast(e) => roots_of(&e.expr, out),
        Expr::Unary(e) => roots_of(&e.expr, out),
        Expr::Try(e) => roots_of(&e.expr, out),
        Expr::Tuple(e) => e.elems.iter().for_each(|e| roots_of(e, out)),
        Expr::Array(e) => e.elems.iter().for_each(|e| roots_of(e, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn handler(item: proc_macro2::TokenStream) -> syn::Result<Handler> {
        Handler::analyze(syn::parse2(item).unwrap())
    }

    fn error(item: proc_macro2::TokenStream) -> String {
        match handler(item) {
            Ok(_) => panic!("expected an error"),
            Err(err) => err
                .into_iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join(" | "),
        }
    }

    #[test]
    fn finds_the_transaction_and_database() {
        let h = handler(quote!(
            async fn f(
                &self,
                mut tx: &mut sqlx::Transaction<'_, Postgres>,
                (a, b): (u8, u8),
                Msg { id, .. }: Msg,
            ) -> R {
            }
        ))
        .unwrap();
        assert_eq!(h.tx_index, 1);
        let db = &h.db;
        assert_eq!(quote!(#db).to_string(), "Postgres");
        let names: Vec<String> = h.params.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["a", "b", "id"]);
        assert_eq!(h.tx_names[0].to_string(), "tx");
    }

    #[test]
    fn reports_each_signature_mistake() {
        let msg = error(quote!(
            fn f(tx: &Tx<'_, Sqlite>) {}
        ));
        assert!(msg.contains("needs an `async fn`"), "{msg}");
        assert!(msg.contains("must return a `Result`"), "{msg}");
        assert!(msg.contains("expected `&mut` to a transaction"), "{msg}");
        assert!(error(quote!(
            async fn f() -> R {}
        ))
        .contains("no transaction parameter"));
    }

    #[test]
    fn expression_roots() {
        let mut roots = Vec::new();
        let expr: Expr = syn::parse_quote!((msg.id.to_string(), self.x, &other[0], CONST, f(y)));
        roots_of(&expr, &mut roots);
        let names: Vec<String> = roots.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["msg", "self", "other"]);
    }

    #[test]
    fn keys_must_use_parameters() {
        let h = handler(quote!(
            async fn on_paid(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> R {}
        ))
        .unwrap();
        let mut errors = Errors::default();
        let value = |expr: Expr| ValueExpr { expr };
        h.check_expr("key", &value(syn::parse_quote!(msg.id)), &mut errors);
        h.check_expr("key", &value(syn::parse_quote!(mgs.id)), &mut errors);
        h.check_expr("version", &value(syn::parse_quote!(tx.v)), &mut errors);
        let msg = errors
            .finish(())
            .unwrap_err()
            .into_iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join(" | ");
        assert!(
            msg.contains("`key` uses `mgs`, which is not a parameter of `on_paid`"),
            "{msg}"
        );
        assert!(msg.contains("parameters it can use: msg"), "{msg}");
        assert!(msg.contains("`version` cannot use `tx`"), "{msg}");
        assert!(!msg.contains("`msg`,"), "{msg}");
    }
}

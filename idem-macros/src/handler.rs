//! The annotated fn, taken apart: its transaction parameter, the database it names, and the
//! names of its other parameters (which the key, version and entity expressions may use).

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
    /// The `idem::Context` parameter, which the macro fills: its index in `sig.inputs`, and
    /// whether it is taken by reference.
    pub context: Option<(usize, bool)>,
    pub context_names: Vec<Ident>,
}

const TX_HINT: &str = "the first parameter (after `self`) must be the transaction the body writes through, e.g. `tx: &mut idem::Tx<'_, Sqlite>`";

impl Handler {
    /// Takes the fn apart, reporting each problem with its signature to `errors`. When there is
    /// one, the fn is handed back unchanged: the caller emits it as written beside the errors.
    pub(crate) fn analyze(item: ItemFn, errors: &mut Errors) -> Result<Handler, Box<ItemFn>> {
        let mut problems = Errors::default();
        let sig = &item.sig;
        if sig.asyncness.is_none() {
            problems.push(syn::Error::new(
                sig.fn_token.span,
                "`#[idempotent]` needs an `async fn`: the handler awaits the database\nadd `async` before `fn`",
            ));
        }
        if let Some(constness) = &sig.constness {
            problems.push(syn::Error::new(
                constness.span,
                "`#[idempotent]` cannot be used on a `const fn`\nremove `const`",
            ));
        }
        let ret = match &sig.output {
            ReturnType::Type(_, ty) => Some((**ty).clone()),
            ReturnType::Default => {
                problems.push(syn::Error::new(
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
                let what = if sig.receiver().is_some() {
                    "no parameter after `self`"
                } else {
                    "no parameters"
                };
                problems.push(syn::Error::new(
                    sig.paren_token.span.join(),
                    format!(
                        "`{}` has {what}, so no transaction to write through\n{TX_HINT}",
                        sig.ident
                    ),
                ));
                None
            }
            Some(tx) => match database_of(&tx.ty) {
                Some(db) => Some(db),
                None => {
                    problems.push(syn::Error::new_spanned(
                        &tx.ty,
                        format!(
                            "expected a transaction, `&mut Tx<'_, DB>`, found `{}`\n{TX_HINT}",
                            type_text(&tx.ty)
                        ),
                    ));
                    None
                }
            },
        };

        let context = sig
            .inputs
            .iter()
            .enumerate()
            .find_map(|(i, arg)| match arg {
                FnArg::Typed(typed) if Some(i) != tx_index => {
                    context_of(&typed.ty).map(|by_ref| (i, by_ref))
                }
                _ => None,
            });
        let mut params = Vec::new();
        let mut tx_names = Vec::new();
        let mut context_names = Vec::new();
        for (i, arg) in sig.inputs.iter().enumerate() {
            if let FnArg::Typed(typed) = arg {
                let names = if Some(i) == tx_index {
                    &mut tx_names
                } else if Some(i) == context.map(|(at, _)| at) {
                    &mut context_names
                } else {
                    &mut params
                };
                bound_names(&typed.pat, names);
            }
        }

        match (tx_index, db, ret, problems.is_empty()) {
            (Some(tx_index), Some(db), Some(ret), true) => Ok(Handler {
                item,
                tx_index,
                db,
                ret,
                params,
                tx_names,
                context,
                context_names,
            }),
            _ => {
                errors.append(problems);
                Err(Box::new(item))
            }
        }
    }

    pub(crate) fn name(&self) -> &Ident {
        &self.item.sig.ident
    }

    pub(crate) fn has_receiver(&self) -> bool {
        self.item.sig.receiver().is_some()
    }

    /// Checks that each name `value` starts from is a parameter, and not the transaction.
    /// Returns the expression if so; otherwise reports each bad name and drops it, so that the
    /// compiler does not report it a second time.
    pub(crate) fn check(
        &self,
        option: &str,
        value: Option<ValueExpr>,
        errors: &mut Errors,
    ) -> Option<ValueExpr> {
        let value = value?;
        let mut roots = Vec::new();
        roots_of(&value.expr, &mut roots);
        let mut ok = true;
        for root in roots {
            let name = root.to_string();
            if name == "self" && self.has_receiver() || self.params.contains(&root) {
                continue;
            }
            ok = false;
            let message = if self.context_names.contains(&root) {
                format!("`{option}` cannot use the context `{name}`: the context is made from the key\nuse a field of the message, e.g. `{option} = \"msg.id\"`")
            } else if self.tx_names.contains(&root) {
                format!("`{option}` cannot use the transaction `{name}`: the key is read before the transaction opens\nuse a field of the message, e.g. `{option} = \"msg.id\"`")
            } else {
                let mut known: Vec<String> = self.params.iter().map(|p| format!("`{p}`")).collect();
                if self.has_receiver() {
                    known.insert(0, "`self`".into());
                }
                let fix = if known.is_empty() {
                    format!("add the message as a parameter of `{}`", self.name())
                } else {
                    format!("start from a parameter: {}", known.join(", "))
                };
                if name == "self" {
                    format!(
                        "`{option}` uses `self`, but `{}` is not a method\n{fix}",
                        self.name()
                    )
                } else {
                    format!(
                        "`{option}` uses `{name}`, which is not a parameter of `{}`\n{fix}",
                        self.name()
                    )
                }
            };
            // A string's tokens all carry the literal's span; a bare expression's, their own.
            errors.push(syn::Error::new(root.span(), message));
        }
        ok.then_some(value)
    }
}

/// A type as the user would write it, for messages: `&Msg`, `&mut Vec<u8>`.
fn type_text(ty: &Type) -> String {
    quote::ToTokens::to_token_stream(ty)
        .to_string()
        .replace("& ", "&")
        .replace(" < ", "<")
        .replace("< ", "<")
        .replace(" >", ">")
        .replace(" ,", ",")
        .replace(" :: ", "::")
        .replace("' _", "'_")
}

/// Whether `ty` is `idem::Context` (`Some(false)`) or a reference to it (`Some(true)`),
/// recognised by the last segment of its path.
fn context_of(ty: &Type) -> Option<bool> {
    let (ty, by_ref) = match ty {
        Type::Reference(reference) if reference.mutability.is_none() => (&*reference.elem, true),
        ty => (ty, false),
    };
    match ty {
        Type::Path(path) if path.qself.is_none() => {
            let last = path.path.segments.last()?;
            (last.ident == "Context" && last.arguments.is_none()).then_some(by_ref)
        }
        _ => None,
    }
}

/// The database of a transaction type: `&mut Tx<'_, DB>` or `&mut sqlx::Transaction<'_, DB>`.
/// The type is recognised by its name, as a macro cannot resolve it.
fn database_of(ty: &Type) -> Option<Type> {
    let Type::Reference(reference) = ty else {
        return None;
    };
    reference.mutability?;
    let Type::Path(path) = &*reference.elem else {
        return None;
    };
    let last = path.path.segments.last()?;
    if last.ident != "Tx" && last.ident != "Transaction" {
        return None;
    }
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

    fn handler(item: proc_macro2::TokenStream) -> Handler {
        let mut errors = Errors::default();
        let handler = Handler::analyze(syn::parse2(item).unwrap(), &mut errors);
        assert_eq!(errors.messages(), "");
        handler.unwrap_or_else(|_| panic!("expected a handler"))
    }

    fn error(item: proc_macro2::TokenStream) -> String {
        let mut errors = Errors::default();
        let item: ItemFn = syn::parse2(item).unwrap();
        let original = quote!(#item).to_string();
        let returned = Handler::analyze(item, &mut errors).err().expect("an error");
        assert_eq!(
            quote!(#returned).to_string(),
            original,
            "the fn comes back as written"
        );
        errors.messages()
    }

    #[test]
    fn finds_the_context_parameter() {
        let mut errors = Errors::default();
        let item = syn::parse_quote!(
            async fn f(tx: &mut Tx<'_, Sqlite>, msg: &Msg, ctx: &idem::Context) -> R {}
        );
        let h = Handler::analyze(item, &mut errors).ok().unwrap();
        assert_eq!(h.context, Some((2, true)));
        assert_eq!(h.context_names[0].to_string(), "ctx");
        assert_eq!(h.params.len(), 1);
        assert_eq!(context_of(&syn::parse_quote!(Context)), Some(false));
        assert_eq!(context_of(&syn::parse_quote!(&mut Context)), None);
        assert_eq!(context_of(&syn::parse_quote!(MyContext)), None);
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
        ));
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
            const fn f(tx: &Tx<'_, Sqlite>) {}
        ));
        assert!(msg.contains("needs an `async fn`"), "{msg}");
        assert!(msg.contains("cannot be used on a `const fn`"), "{msg}");
        assert!(msg.contains("must return a `Result`"), "{msg}");
        assert!(
            msg.contains("expected a transaction, `&mut Tx<'_, DB>`, found `&Tx<'_, Sqlite>`"),
            "{msg}"
        );
        let msg = error(quote!(
            async fn f() -> R {}
        ));
        assert!(msg.contains("`f` has no parameters"), "{msg}");
        let msg = error(quote!(
            async fn f(&self) -> R {}
        ));
        assert!(msg.contains("`f` has no parameter after `self`"), "{msg}");
    }

    #[test]
    fn only_transaction_types_are_transactions() {
        for ty in [
            quote!(&mut Tx<'_, Sqlite>),
            quote!(&mut idem::Tx<'c, sqlx::Postgres>),
            quote!(&mut Transaction<'static, Sqlite>),
        ] {
            let ty: Type = syn::parse2(ty).unwrap();
            assert!(database_of(&ty).is_some(), "{}", type_text(&ty));
        }
        for ty in [
            quote!(&Tx<'_, Sqlite>),
            quote!(Tx<'_, Sqlite>),
            quote!(&mut Vec<u8>),
            quote!(&mut SqliteConnection),
            quote!(&mut Tx<'_>),
        ] {
            let ty: Type = syn::parse2(ty).unwrap();
            assert!(database_of(&ty).is_none(), "{}", type_text(&ty));
        }
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
        ));
        let mut errors = Errors::default();
        let value = |expr: Expr| {
            Some(ValueExpr {
                expr,
                in_string: false,
            })
        };
        assert!(h
            .check("key", value(syn::parse_quote!(msg.id)), &mut errors)
            .is_some());
        assert!(h
            .check("key", value(syn::parse_quote!(mgs.id)), &mut errors)
            .is_none());
        assert!(h
            .check("version", value(syn::parse_quote!(tx.v)), &mut errors)
            .is_none());
        assert!(h
            .check("entity", value(syn::parse_quote!(self.v)), &mut errors)
            .is_none());
        let msg = errors.messages();
        assert!(
            msg.contains("`key` uses `mgs`, which is not a parameter of `on_paid`"),
            "{msg}"
        );
        assert!(msg.contains("start from a parameter: `msg`"), "{msg}");
        assert!(
            msg.contains("`version` cannot use the transaction `tx`"),
            "{msg}"
        );
        assert!(
            msg.contains("`entity` uses `self`, but `on_paid` is not a method"),
            "{msg}"
        );
        assert_eq!(msg.matches(" | ").count(), 2, "{msg}");
    }
}

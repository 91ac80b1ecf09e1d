//! The options of `#[idempotent(...)]`, parsed with `syn::meta::parser`.

use proc_macro2::{Span, TokenStream};
use syn::parse::Parser as _;
use syn::spanned::Spanned as _;
use syn::{Expr, LitStr, Path};

use crate::suggest;

const OPTIONS: &[&str] = &["key", "version", "entity", "scope", "crate"];

/// An expression over the handler's parameters, written as a string (`key = "msg.id"`) or bare
/// (`key = msg.id`). For a string, every token of `expr` carries the literal's span.
pub(crate) struct ValueExpr {
    pub expr: Expr,
}

/// The parsed options, each with the span of its name for errors about it.
pub(crate) struct Args {
    pub key: ValueExpr,
    pub version: Option<ValueExpr>,
    pub entity: Option<ValueExpr>,
    pub scope: Option<LitStr>,
    pub krate: Option<Path>,
}

/// Collects independent errors so that the user sees all of them in one build.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub fn push(&mut self, err: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(err),
            None => self.0 = Some(err),
        }
    }

    pub fn finish<T>(self, value: T) -> syn::Result<T> {
        match self.0 {
            Some(err) => Err(err),
            None => Ok(value),
        }
    }
}

impl Args {
    pub(crate) fn parse(tokens: TokenStream) -> syn::Result<Args> {
        let mut errors = Errors::default();
        let (mut key, mut version, mut entity, mut scope, mut krate) =
            (None, None, None, None, None);
        let mut entity_span = None;
        syn::meta::parser(|meta| {
            let name = meta.path.get_ident().map(ToString::to_string).unwrap_or_default();
            let span = meta.path.span();
            match name.as_str() {
                "key" => set_once(&mut key, &name, span, value_expr(&meta)?, &mut errors),
                "version" => set_once(&mut version, &name, span, value_expr(&meta)?, &mut errors),
                "entity" => {
                    entity_span = Some(span);
                    set_once(&mut entity, &name, span, value_expr(&meta)?, &mut errors)
                }
                "scope" => {
                    let lit = string_value(&meta, "scope", "\"billing::on_paid\"")?;
                    if lit.value().trim().is_empty() {
                        errors.push(syn::Error::new(lit.span(), "`scope` must not be empty"));
                    }
                    set_once(&mut scope, &name, span, lit, &mut errors)
                }
                "crate" => {
                    let lit = string_value(&meta, "crate", "\"my_platform::idem\"")?;
                    let path = crate_path(&lit)?;
                    set_once(&mut krate, &name, span, path, &mut errors)
                }
                _ => {
                    let hint = match suggest::closest(&name, OPTIONS) {
                        Some(close) => format!("; did you mean `{close}`?"),
                        None => String::new(),
                    };
                    // Skip the value so the remaining options are still checked.
                    if meta.input.peek(syn::Token![=]) {
                        let _: Expr = meta.value()?.parse()?;
                    }
                    errors.push(meta.error(format!(
                        "unknown option `{}` of `#[idempotent]`{hint}\nexpected one of: key, version, entity, scope, crate",
                        path_text(&meta.path)
                    )));
                    Ok(())
                }
            }
        })
        .parse2(tokens)?;

        if let (Some(span), None) = (entity_span, &version) {
            errors.push(syn::Error::new(
                span,
                "`entity` needs `version`: the entity is what the version orders\nadd `version = \"msg.version\"`, or remove `entity`",
            ));
        }
        let Some(key) = key else {
            errors.push(syn::Error::new(
                Span::call_site(),
                "missing `key`: name the idempotency key, e.g. `#[idempotent(key = \"msg.id\")]`",
            ));
            return Err(errors.0.expect("an error was just pushed"));
        };
        errors.finish(Args {
            key,
            version,
            entity,
            scope,
            krate,
        })
    }
}

/// Stores `value` unless the option was already given, which is an error at its second use.
fn set_once<T>(
    slot: &mut Option<T>,
    name: &str,
    span: Span,
    value: T,
    errors: &mut Errors,
) -> syn::Result<()> {
    if slot.is_some() {
        errors.push(syn::Error::new(
            span,
            format!("`{name}` is given more than once"),
        ));
    } else {
        *slot = Some(value);
    }
    Ok(())
}

/// `= "expr"` or `= expr`.
fn value_expr(meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<ValueExpr> {
    let expr: Expr = meta.value()?.parse()?;
    let expr = ungroup(expr);
    match expr {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(lit),
            ..
        }) => {
            if !lit.suffix().is_empty() {
                return Err(syn::Error::new(
                    lit.span(),
                    "unexpected suffix on the string literal",
                ));
            }
            if lit.value().trim().is_empty() {
                return Err(syn::Error::new(
                    lit.span(),
                    "empty expression: write an expression over the parameters, e.g. \"msg.id\"",
                ));
            }
            let parsed: Expr = lit.parse().map_err(|err| {
                syn::Error::new(
                    lit.span(),
                    format!("`{}` is not a valid Rust expression: {err}", lit.value()),
                )
            })?;
            Ok(ValueExpr { expr: parsed })
        }
        expr => Ok(ValueExpr { expr }),
    }
}

/// `= "text"`; anything else is an error that shows the expected form.
fn string_value(
    meta: &syn::meta::ParseNestedMeta<'_>,
    name: &str,
    example: &str,
) -> syn::Result<LitStr> {
    let expr = ungroup(meta.value()?.parse()?);
    match expr {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(lit),
            ..
        }) => Ok(lit),
        other => Err(syn::Error::new(
            other.span(),
            format!("`{name}` takes a string literal, e.g. `{name} = {example}`"),
        )),
    }
}

/// The `crate = "..."` path: a path that means the same in every module.
fn crate_path(lit: &LitStr) -> syn::Result<Path> {
    let path: Path = lit
        .parse()
        .map_err(|_| syn::Error::new(lit.span(), format!("`{}` is not a path", lit.value())))?;
    let first = path
        .segments
        .first()
        .map(|s| s.ident.to_string())
        .unwrap_or_default();
    if path.leading_colon.is_none() && (first == "self" || first == "super") {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "`crate = \"{}\"` is relative; use a path that means the same in every module, e.g. `crate = \"::idem\"` or `crate = \"my_platform::idem\"`",
                lit.value()
            ),
        ));
    }
    Ok(path)
}

/// Removes the invisible groups `macro_rules!` puts around `$e` fragments.
fn ungroup(mut expr: Expr) -> Expr {
    while let Expr::Group(group) = expr {
        expr = *group.expr;
    }
    expr
}

fn path_text(path: &Path) -> String {
    let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
    segments.join("::")
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn parse(tokens: TokenStream) -> syn::Result<Args> {
        Args::parse(tokens)
    }

    fn message(tokens: TokenStream) -> String {
        match parse(tokens) {
            Ok(_) => panic!("expected an error"),
            Err(err) => err
                .into_iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join(" | "),
        }
    }

    #[test]
    fn string_and_bare_forms_parse_the_same() {
        let a = parse(quote!(key = "msg.id", version = "msg.version")).unwrap();
        let b = parse(quote!(key = msg.id, version = msg.version)).unwrap();
        let show = |e: &Expr| quote!(#e).to_string();
        assert_eq!(show(&a.key.expr), show(&b.key.expr));
        assert_eq!(
            show(&a.version.unwrap().expr),
            show(&b.version.unwrap().expr)
        );
    }

    #[test]
    fn scope_and_crate_are_kept() {
        let args = parse(quote!(key = "m.id", scope = "billing", crate = "my::idem")).unwrap();
        assert_eq!(args.scope.unwrap().value(), "billing");
        assert_eq!(path_text(&args.krate.unwrap()), "my::idem");
    }

    #[test]
    fn missing_key_says_how_to_write_one() {
        assert!(message(quote!(version = "m.v")).contains("missing `key`"));
        assert!(message(quote!()).contains("missing `key`"));
    }

    #[test]
    fn every_independent_mistake_is_reported() {
        let msg = message(quote!(
            key = "m.id",
            key = "m.id",
            versoin = "m.v",
            entity = "m.e"
        ));
        assert!(msg.contains("`key` is given more than once"), "{msg}");
        assert!(msg.contains("did you mean `version`"), "{msg}");
        assert!(msg.contains("`entity` needs `version`"), "{msg}");
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(message(quote!(key = "")).contains("empty expression"));
        assert!(message(quote!(key = "msg.")).contains("not a valid Rust expression"));
        assert!(message(quote!(key = "m.id", scope = 3)).contains("`scope` takes a string literal"));
        assert!(message(quote!(key = "m.id", crate = "super::idem")).contains("is relative"));
        assert!(message(quote!(key = "m.id", scope = "  ")).contains("must not be empty"));
    }
}

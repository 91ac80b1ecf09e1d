//! The options of `#[idempotent(...)]`, parsed with `syn::meta::parser`.
//!
//! A malformed, unknown or repeated option is reported and otherwise ignored, so the user sees
//! every mistake in one build, and the expansion still goes ahead with the options that are valid
//! (see `expand::idempotent`).

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use syn::parse::Parser as _;
use syn::spanned::Spanned as _;
use syn::visit_mut::VisitMut;
use syn::{Expr, LitStr, Path};

use crate::suggest;

const OPTIONS: &[&str] = &[
    "key",
    "version",
    "entity",
    "scope",
    "retention",
    "mode",
    "lease",
    "fingerprint",
    "replay",
    "max_attempts",
    "crate",
];

/// An expression over the handler's parameters, written as a string (`key = "msg.id"`) or bare
/// (`key = msg.id`). For a string, every token of `expr` carries the literal's span.
pub(crate) struct ValueExpr {
    pub expr: Expr,
    /// Written as a string: its field and method names are in the macro's context (`in_string`).
    pub in_string: bool,
}

/// The options that were given and valid.
#[derive(Default)]
pub(crate) struct Args {
    pub key: Option<ValueExpr>,
    pub version: Option<ValueExpr>,
    pub entity: Option<ValueExpr>,
    pub scope: Option<LitStr>,
    pub krate: Option<Path>,
    /// `retention = "30d"`: how long records are kept.
    pub retention: Option<Duration>,
    /// `mode = "lease"`: claim first with a lease, for effects outside the database.
    pub lease_mode: bool,
    /// `lease = "30s"`: the lease of lease mode.
    pub lease: Option<Duration>,
    /// `fingerprint = "msg.body"`: the payload whose hash a reused key must match.
    pub fingerprint: Option<ValueExpr>,
    /// `replay = true`: keep the body's value for duplicates.
    pub replay: bool,
    /// `max_attempts = 5`: poison the message after this many failures.
    pub max_attempts: Option<u32>,
    /// Where the options that need a capability of the database beyond `Store` were written.
    pub at: OptionSpans,
}

/// The span of each option that needs a capability of the database (`Stamps`, `Attempts`,
/// `Leases`): the generated call that asks for it is spanned there, so that a database without
/// the capability is an error at the option.
#[derive(Default)]
pub(crate) struct OptionSpans {
    pub mode: Option<Span>,
    pub fingerprint: Option<Span>,
    pub replay: Option<Span>,
    pub max_attempts: Option<Span>,
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

    pub fn append(&mut self, other: Errors) {
        if let Some(err) = other.0 {
            self.push(err);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// Appends one `compile_error!` per collected error to `tokens`.
    pub fn emit_into(self, mut tokens: TokenStream) -> TokenStream {
        if let Some(err) = self.0 {
            tokens.extend(err.into_compile_error());
        }
        tokens
    }

    #[cfg(test)]
    pub fn messages(&self) -> String {
        self.0
            .iter()
            .flat_map(|err| err.clone().into_iter())
            .map(|err| err.to_string())
            .collect::<Vec<_>>()
            .join(" | ")
    }
}

/// An option's value: `None` while the option is absent, `Some(None)` once it was given with a
/// value that was refused (so it is neither "missing" nor used).
type Slot<T> = Option<Option<T>>;

impl Args {
    /// Parses the options. Every mistake goes to `errors`; the options that are valid are kept.
    pub(crate) fn parse(tokens: TokenStream, errors: &mut Errors) -> Args {
        let (mut key, mut version, mut entity, mut scope, mut krate) =
            (None, None, None, None, None);
        let (mut retention, mut mode, mut lease) = (None, None, None);
        let (mut fingerprint, mut replay, mut max_attempts) = (None, None, None);
        let (mut entity_span, mut lease_span) = (None, None);
        let mut at = OptionSpans::default();
        let parsed = syn::meta::parser(|meta| {
            let name = meta.path.get_ident().map(ToString::to_string);
            let span = meta.path.span();
            match name.as_deref() {
                Some("key") => {
                    let value = value_expr(&meta, "key", errors)?;
                    set_once(&mut key, "key", span, value, errors);
                }
                Some("version") => {
                    let value = value_expr(&meta, "version", errors)?;
                    set_once(&mut version, "version", span, value, errors);
                }
                Some("entity") => {
                    entity_span = Some(span);
                    let value = value_expr(&meta, "entity", errors)?;
                    set_once(&mut entity, "entity", span, value, errors);
                }
                Some("scope") => {
                    let value = string_value(&meta, "scope", "\"billing::on_paid\"", errors)?
                        .and_then(|lit| {
                            if lit.value().trim().is_empty() {
                                errors.push(syn::Error::new(
                                    lit.span(),
                                    "`scope` must not be empty\nname the handler, e.g. `scope = \"billing::on_paid\"`",
                                ));
                                return None;
                            }
                            if lit.value().contains('\0') {
                                errors.push(syn::Error::new(
                                    lit.span(),
                                    "`scope` must not contain a NUL character (`\\0`): PostgreSQL text cannot store it",
                                ));
                                return None;
                            }
                            Some(lit)
                        });
                    set_once(&mut scope, "scope", span, value, errors);
                }
                Some("retention") => {
                    let value = string_value(&meta, "retention", "\"30d\"", errors)?
                        .and_then(|lit| duration_value(&lit, "retention", errors));
                    set_once(&mut retention, "retention", span, value, errors);
                }
                Some("lease") => {
                    lease_span = Some(span);
                    let value = string_value(&meta, "lease", "\"30s\"", errors)?
                        .and_then(|lit| duration_value(&lit, "lease", errors));
                    set_once(&mut lease, "lease", span, value, errors);
                }
                Some("mode") => {
                    let value = string_value(&meta, "mode", "\"lease\"", errors)?.and_then(|lit| {
                        match lit.value().as_str() {
                            "lease" => Some(true),
                            "transaction" => Some(false),
                            other => {
                                errors.push(syn::Error::new(
                                    lit.span(),
                                    format!("unknown mode `{other}`\nuse `mode = \"lease\"` for effects outside the database, or leave `mode` out (`\"transaction\"`)"),
                                ));
                                None
                            }
                        }
                    });
                    at.mode.get_or_insert(span);
                    set_once(&mut mode, "mode", span, value, errors);
                }
                Some("fingerprint") => {
                    let value = value_expr(&meta, "fingerprint", errors)?;
                    at.fingerprint.get_or_insert(span);
                    set_once(&mut fingerprint, "fingerprint", span, value, errors);
                }
                Some("replay") => {
                    let value = bool_value(&meta, "replay", errors)?;
                    at.replay.get_or_insert(span);
                    set_once(&mut replay, "replay", span, value, errors);
                }
                Some("max_attempts") => {
                    let value = attempts_value(&meta, errors)?;
                    at.max_attempts.get_or_insert(span);
                    set_once(&mut max_attempts, "max_attempts", span, value, errors);
                }
                Some("crate") => {
                    let value = string_value(&meta, "crate", "\"my_platform::idem\"", errors)?
                        .and_then(|lit| crate_path(&lit).map_err(|e| errors.push(e)).ok());
                    set_once(&mut krate, "crate", span, value, errors);
                }
                _ => {
                    // Skip the value, so that the options after this one are still checked.
                    if meta.input.peek(syn::Token![=]) {
                        let _: Expr = meta.value()?.parse()?;
                    } else if !meta.input.is_empty() && !meta.input.peek(syn::Token![,]) {
                        let _: TokenStream = meta.input.parse()?;
                    }
                    errors.push(syn::Error::new_spanned(
                        &meta.path,
                        unknown_option(&path_text(&meta.path)),
                    ));
                }
            }
            Ok(())
        })
        .parse2(tokens);

        match parsed {
            // The options after a syntax error were not read: a "missing `key`" could be wrong.
            Err(err) => errors.push(err),
            Ok(()) if key.is_none() => errors.push(syn::Error::new(
                Span::call_site(),
                "missing `key`: name the idempotency key\nadd `key = \"msg.id\"`, an expression over the parameters",
            )),
            Ok(()) => {}
        }
        let mut entity = entity.flatten();
        if let (Some(span), None) = (entity_span, &version) {
            errors.push(syn::Error::new(
                span,
                "`entity` needs `version`: the entity is what the version orders\nadd `version = \"msg.version\"`, or remove `entity`",
            ));
            entity = None;
        }
        let lease_mode = mode.flatten().unwrap_or(false);
        if let (Some(span), false) = (lease_span, lease_mode) {
            errors.push(syn::Error::new(
                span,
                "`lease` needs `mode = \"lease\"`\nadd `mode = \"lease\"`, or remove `lease`",
            ));
        }
        Args {
            retention: retention.flatten(),
            lease_mode,
            lease: lease.flatten(),
            key: key.flatten(),
            version: version.flatten(),
            entity,
            scope: scope.flatten(),
            krate: krate.flatten(),
            fingerprint: fingerprint.flatten(),
            replay: replay.flatten().unwrap_or(false),
            max_attempts: max_attempts.flatten(),
            at,
        }
    }
}

/// `= true` or `= false`.
fn bool_value(
    meta: &syn::meta::ParseNestedMeta<'_>,
    name: &str,
    errors: &mut Errors,
) -> syn::Result<Option<bool>> {
    let expr = ungroup(value_of(meta, name)?.parse()?);
    if let Expr::Lit(syn::ExprLit {
        lit: syn::Lit::Bool(lit),
        ..
    }) = &expr
    {
        return Ok(Some(lit.value));
    }
    errors.push(syn::Error::new_spanned(
        &expr,
        format!("`{name}` takes `true` or `false`\nwrite `{name} = true`"),
    ));
    Ok(None)
}

/// `max_attempts = N`, a whole number from 1 to `u32::MAX`.
fn attempts_value(
    meta: &syn::meta::ParseNestedMeta<'_>,
    errors: &mut Errors,
) -> syn::Result<Option<u32>> {
    let expr = ungroup(value_of(meta, "max_attempts")?.parse()?);
    let message = match &expr {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(lit),
            ..
        }) => match lit.base10_parse::<u32>() {
            Ok(0) => "`max_attempts` must be at least 1: the handler runs at most this many times\nwrite e.g. `max_attempts = 5`, or remove it".to_string(),
            Ok(n) => return Ok(Some(n)),
            Err(err) => format!("bad `max_attempts`: {err}\nwrite a whole number from 1 up, e.g. `max_attempts = 5`"),
        },
        _ => "`max_attempts` takes a whole number\nwrite e.g. `max_attempts = 5`".to_string(),
    };
    errors.push(syn::Error::new_spanned(&expr, message));
    Ok(None)
}

fn unknown_option(name: &str) -> String {
    match suggest::closest(name, OPTIONS) {
        Some(close) => format!("unknown option `{name}`: did you mean `{close}`?"),
        None => format!(
            "unknown option `{name}`\n`#[idempotent]` takes `key`, `version`, `entity`, `scope`, `retention`, `mode`, `lease`, `fingerprint`, `replay`, `max_attempts` and `crate`"
        ),
    }
}

/// A duration literal (`"30d"`), checked at compile time.
fn duration_value(lit: &LitStr, name: &str, errors: &mut Errors) -> Option<Duration> {
    match crate::duration::parse(&lit.value()) {
        Ok(duration) => Some(duration),
        Err(problem) => {
            errors.push(syn::Error::new(
                lit.span(),
                format!("bad `{name}`: {problem}"),
            ));
            None
        }
    }
}

/// Stores `value` unless the option was already given, which is an error at its second use.
fn set_once<T>(slot: &mut Slot<T>, name: &str, span: Span, value: Option<T>, errors: &mut Errors) {
    if slot.is_some() {
        errors.push(syn::Error::new(
            span,
            format!("`{name}` is given more than once\nkeep one `{name} = ...`"),
        ));
    } else {
        *slot = Some(value);
    }
}

/// `= "expr"` or `= expr`. Syntax errors in the attribute itself end the parse (`Err`); a value
/// that is well-formed but unusable is reported to `errors` and gives `Ok(None)`.
fn value_expr(
    meta: &syn::meta::ParseNestedMeta<'_>,
    name: &str,
    errors: &mut Errors,
) -> syn::Result<Option<ValueExpr>> {
    let expr = ungroup(value_of(meta, name)?.parse()?);
    let Expr::Lit(syn::ExprLit {
        lit: syn::Lit::Str(lit),
        ..
    }) = expr
    else {
        return Ok(Some(ValueExpr {
            expr,
            in_string: false,
        }));
    };
    let result = if !lit.suffix().is_empty() {
        Err(format!(
            "unexpected suffix `{}` on the string literal\nremove it",
            lit.suffix()
        ))
    } else if lit.value().trim().is_empty() {
        Err(format!("`{name}` is empty\nwrite an expression over the parameters, e.g. `{name} = \"msg.id\"`"))
    } else {
        lit.parse::<Expr>().map(|expr| in_string(expr, lit.span())).map_err(|err| {
            format!(
                "`{name} = \"{}\"` is not a valid Rust expression: {err}\nwrite an expression over the parameters, e.g. `{name} = \"msg.id\"`",
                lit.value()
            )
        })
    };
    match result {
        Ok(expr) => Ok(Some(ValueExpr {
            expr,
            in_string: true,
        })),
        Err(message) => {
            errors.push(syn::Error::new(lit.span(), message));
            Ok(None)
        }
    }
}

/// The `=` after an option's name, with a message that shows the expected form.
fn value_of<'a>(
    meta: &'a syn::meta::ParseNestedMeta<'_>,
    name: &str,
) -> syn::Result<syn::parse::ParseStream<'a>> {
    meta.value().map_err(|err| {
        syn::Error::new(
            err.span(),
            format!("expected `=` after `{name}`\nwrite `{name} = \"...\"`"),
        )
    })
}

/// An expression parsed from a string literal, whose tokens all carry the literal's span.
/// Field and method names are moved to the macro's context (at the same place): the compiler
/// then still reports a wrong field at the literal, but does not suggest replacing the whole
/// literal with the field's name, which would be wrong.
fn in_string(mut expr: Expr, lit: Span) -> Expr {
    struct Members(Span);
    impl VisitMut for Members {
        fn visit_member_mut(&mut self, member: &mut syn::Member) {
            match member {
                syn::Member::Named(ident) => ident.set_span(self.0),
                syn::Member::Unnamed(index) => index.span = self.0,
            }
        }
        fn visit_expr_method_call_mut(&mut self, call: &mut syn::ExprMethodCall) {
            call.method.set_span(self.0);
            syn::visit_mut::visit_expr_method_call_mut(self, call);
        }
    }
    Members(Span::mixed_site().located_at(lit)).visit_expr_mut(&mut expr);
    expr
}

/// `= "text"`; anything else is reported with the expected form, and gives `Ok(None)`.
fn string_value(
    meta: &syn::meta::ParseNestedMeta<'_>,
    name: &str,
    example: &str,
    errors: &mut Errors,
) -> syn::Result<Option<LitStr>> {
    match ungroup(value_of(meta, name)?.parse()?) {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(lit),
            ..
        }) => Ok(Some(lit)),
        other => {
            errors.push(syn::Error::new_spanned(
                other,
                format!("`{name}` takes a string literal\nwrite `{name} = {example}`"),
            ));
            Ok(None)
        }
    }
}

/// The `crate = "..."` path: a path that means the same in every module.
fn crate_path(lit: &LitStr) -> syn::Result<Path> {
    let path: Path = lit.parse().map_err(|_| {
        syn::Error::new(
            lit.span(),
            format!(
                "`crate = \"{}\"` is not a path\nwrite where idem is, e.g. `crate = \"my_platform::idem\"`",
                lit.value()
            ),
        )
    })?;
    let first = path
        .segments
        .first()
        .map(|s| s.ident.to_string())
        .unwrap_or_default();
    if path.leading_colon.is_none() && (first == "self" || first == "super") {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "`crate = \"{}\"` is relative: it would mean something else in another module\nuse an absolute path, e.g. `crate = \"::my_platform::idem\"` or `crate = \"crate::idem\"`",
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

    fn parse(tokens: TokenStream) -> (Args, String) {
        let mut errors = Errors::default();
        let args = Args::parse(tokens, &mut errors);
        (args, errors.messages())
    }

    fn message(tokens: TokenStream) -> String {
        let (_, message) = parse(tokens);
        assert!(!message.is_empty(), "expected an error");
        message
    }

    fn show(value: Option<&ValueExpr>) -> String {
        let expr = &value.expect("a value").expr;
        quote!(#expr).to_string()
    }

    #[test]
    fn string_and_bare_forms_parse_the_same() {
        let (a, none) = parse(quote!(key = "msg.id", version = "msg.version"));
        assert_eq!(none, "");
        let (b, none) = parse(quote!(key = msg.id, version = msg.version));
        assert_eq!(none, "");
        assert_eq!(show(a.key.as_ref()), show(b.key.as_ref()));
        assert_eq!(show(a.version.as_ref()), show(b.version.as_ref()));
    }

    #[test]
    fn scope_and_crate_are_kept() {
        let (args, none) = parse(quote!(key = "m.id", scope = "billing", crate = "my::idem"));
        assert_eq!(none, "");
        assert_eq!(args.scope.unwrap().value(), "billing");
        assert_eq!(path_text(&args.krate.unwrap()), "my::idem");
    }

    #[test]
    fn missing_key_says_how_to_write_one() {
        assert!(message(quote!(version = "m.v")).contains("missing `key`"));
        assert!(message(quote!()).contains("missing `key`"));
    }

    #[test]
    fn a_syntax_error_does_not_also_claim_the_key_is_missing() {
        let msg = message(quote!(version "m.v", key = "m.id"));
        assert!(!msg.contains("missing `key`"), "{msg}");
    }

    #[test]
    fn every_independent_mistake_is_reported() {
        let msg = message(quote!(
            key = "m.id",
            key = "m.id",
            versoin = "m.v",
            entity = "m.e",
            scope = 3,
            retries(5),
        ));
        assert!(msg.contains("`key` is given more than once"), "{msg}");
        assert!(msg.contains("did you mean `version`"), "{msg}");
        assert!(msg.contains("`entity` needs `version`"), "{msg}");
        assert!(msg.contains("`scope` takes a string literal"), "{msg}");
        assert!(msg.contains("unknown option `retries`\n"), "{msg}");
    }

    #[test]
    fn refused_values_are_dropped_and_valid_ones_kept() {
        let (args, msg) = parse(quote!(key = "", version = "m.v", entity = "m.", scope = 1));
        assert!(msg.contains("`key` is empty"), "{msg}");
        assert!(msg.contains("not a valid Rust expression"), "{msg}");
        // A key that was given but refused is not also reported as missing.
        assert!(!msg.contains("missing `key`"), "{msg}");
        assert!(args.key.is_none() && args.entity.is_none() && args.scope.is_none());
        assert_eq!(show(args.version.as_ref()), "m . v");
    }

    #[test]
    fn a_missing_equals_sign_shows_the_form() {
        let msg = message(quote!(key "m.id"));
        assert!(msg.contains("expected `=` after `key`"), "{msg}");
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(message(quote!(key = "msg.")).contains("`key = \"msg.\"` is not a valid Rust"));
        assert!(message(quote!(key = "m.id", scope = 3)).contains("`scope` takes a string literal"));
        assert!(message(quote!(key = "m.id", crate = "super::idem")).contains("is relative"));
        assert!(message(quote!(key = "m.id", crate = "a b")).contains("is not a path"));
        assert!(message(quote!(key = "m.id", scope = "  ")).contains("must not be empty"));
        assert!(message(quote!(key = "m.id", scope = "a\0b")).contains("must not contain a NUL"));
        assert!(message(quote!(key = "m.id"x)).contains("unexpected suffix `x`"));
    }

    #[test]
    fn absolute_crate_paths_are_accepted() {
        for path in [
            quote!(crate = "::idem"),
            quote!(crate = "crate::idem"),
            quote!(crate = "my::idem"),
        ] {
            let (args, none) = parse(quote!(key = "m.id", #path));
            assert_eq!(none, "");
            assert!(args.krate.is_some());
        }
    }
}

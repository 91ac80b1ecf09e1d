//! Snapshots of the generated code, pretty-printed as `cargo expand` shows it, for each mode, a
//! method and a generic fn. They live in `tests/snapshots/*.rs` so that a change in the generated
//! code shows in review. After a deliberate change, rewrite them with
//! `IDEM_BLESS=1 cargo test -p idem-macros` and read the diff.
//!
//! The book's internals page shows `tests/snapshots/orders_on_status.rs`, the expansion of the
//! handler `on_status` of `examples/orders.rs`, checked here against the example as it is.

use std::path::{Path, PathBuf};

use proc_macro2::TokenStream;
use quote::quote;

/// The expansion of `#[idempotent(args)] item`, as `prettyplease` (and so `cargo expand`) prints it.
fn expand(args: &TokenStream, item: &TokenStream) -> String {
    let out = crate::expand::idempotent(args.clone(), item.clone());
    prettyplease::unparse(&syn::parse2(out).expect("the expansion parses as a file"))
}

fn input(args: &TokenStream, item: &TokenStream) -> String {
    let file = quote!(#[idempotent(#args)] #item);
    prettyplease::unparse(&syn::parse2(file).expect("the input parses as a file"))
}

fn snapshot_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(format!("{name}.rs"))
}

fn blessing() -> bool {
    std::env::var_os("IDEM_BLESS").is_some_and(|v| v == "1")
}

/// Compares the input and expansion with the snapshot `name`, or rewrites it under `IDEM_BLESS=1`.
fn assert_snapshot(name: &str, args: TokenStream, item: TokenStream) -> String {
    let expansion = expand(&args, &item);
    let commented: String = input(&args, &item)
        .lines()
        .map(|line| format!("// {line}").trim_end().to_string() + "\n")
        .collect();
    let actual = format!("// Input:\n{commented}//\n// Expansion:\n{expansion}");
    let path = snapshot_path(name);
    if blessing() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &actual).unwrap();
        return expansion;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        expected == actual,
        "the expansion `{name}` differs from {}:\n{}\nreview it, then accept it with IDEM_BLESS=1",
        path.display(),
        diff(&expected, &actual)
    );
    expansion
}

/// A line diff (`-` expected, `+` actual), by longest common subsequence; inputs are small.
fn diff(expected: &str, actual: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    let mut lcs = vec![vec![0_usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            out += &format!("  {}\n", a[i]);
            (i, j) = (i + 1, j + 1);
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            out += &format!("+ {}\n", b[j]);
            j += 1;
        } else {
            out += &format!("- {}\n", a[i]);
            i += 1;
        }
    }
    out
}

#[test]
fn the_diff_marks_changed_lines() {
    assert_eq!(diff("a\nb\nc", "a\nx\nc"), "  a\n+ x\n- b\n  c\n");
    assert_eq!(diff("", "a"), "+ a\n");
    assert_eq!(diff("a", ""), "- a\n");
}

#[test]
fn key_only() {
    let out = assert_snapshot(
        "key_only",
        quote!(key = "msg.id"),
        quote! {
            async fn on_paid(tx: &mut Tx<'_, Sqlite>, msg: &Paid) -> Result<(), sqlx::Error> {
                sqlx::query("UPDATE orders SET paid = 1 WHERE id = ?")
                    .bind(msg.order_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }
        },
    );
    // Without `scope`, the default is the fn's path.
    assert!(out.contains(r#"::core::concat!(::core::module_path!(), "::", "on_paid")"#));
    // Without `fingerprint`, `replay`, `max_attempts` and lease mode, none of their glue (no
    // new call, no capability asked for).
    for glue in [
        "catch_unwind",
        "encode",
        "replayed",
        "fingerprint",
        "begin_counted",
        "lease_mode",
        "let __idem_claim = __idem_claim",
    ] {
        assert!(!out.contains(glue), "{glue} in {out}");
    }
}

#[test]
fn key_version() {
    assert_snapshot(
        "key_version",
        quote!(
            key = "msg.account_id",
            version = "msg.seq",
            scope = "ledger::balance"
        ),
        quote! {
            pub async fn on_balance(
                tx: &mut Tx<'_, Postgres>,
                msg: &BalanceChanged,
            ) -> Result<(), sqlx::Error> {
                sqlx::query("UPDATE accounts SET balance = $1 WHERE id = $2")
                    .bind(msg.balance)
                    .bind(msg.account_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }
        },
    );
}

/// The case the issue measures: at most 40 lines after pretty-printing.
#[test]
fn key_version_entity() {
    let out = assert_snapshot(
        "key_version_entity",
        quote!(
            key = "msg.id",
            version = "msg.version",
            entity = "msg.order_id",
            scope = "orders::status"
        ),
        quote! {
            async fn on_status_changed(
                tx: &mut Tx<'_, Sqlite>,
                msg: &StatusChanged,
            ) -> Result<(), AppError> {
                sqlx::query("UPDATE orders SET status = ? WHERE id = ?")
                    .bind(&msg.status)
                    .bind(msg.order_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }
        },
    );
    let lines = out.lines().count();
    assert!(lines <= 40, "the expansion grew to {lines} lines:\n{out}");
}

#[test]
fn method() {
    assert_snapshot(
        "method",
        quote!(key = "(self.tenant, msg.id)", scope = "billing::charge"),
        quote! {
            /// Charges the order once per payment event.
            pub(crate) async fn charge(
                &self,
                tx: &mut Tx<'_, Postgres>,
                msg: &Paid,
            ) -> anyhow::Result<ChargeId> {
                let id = self.gateway.charge(msg.amount).await?;
                Ok(id)
            }
        },
    );
}

#[test]
fn generic() {
    assert_snapshot(
        "generic",
        quote!(
            key = msg.id(),
            version = msg.version(),
            crate = "my_platform::idem"
        ),
        quote! {
            async fn on_event<DB, M>(tx: &mut Tx<'_, DB>, msg: &M) -> Result<impl Display, E>
            where
                DB: Store,
                M: Event + Sync,
            {
                Ok(msg.describe())
            }
        },
    );
}

#[test]
fn lease_mode_with_context() {
    let out = assert_snapshot(
        "lease_context",
        quote!(
            key = "msg.id",
            scope = "payments::charge",
            mode = "lease",
            lease = "45s",
            retention = "14d"
        ),
        quote! {
            async fn charge(
                tx: &mut Tx<'_, Postgres>,
                msg: &ChargeRequested,
                ctx: &Context,
                provider: &Provider,
            ) -> Result<String, Error> {
                let id = provider.charge(&ctx.derive("charge"), msg.amount).await?;
                Ok(id)
            }
        },
    );
    // The context is filled by the macro, not passed by callers; a lease takes a pool.
    assert!(
        out.contains("tx: impl ::idem::LeaseTransact<'__idem_source, Postgres>"),
        "{out}"
    );
    assert!(!out.contains("ctx: &Context,"), "{out}");
    assert!(
        out.contains("let ctx: &Context = __idem_run.context();"),
        "{out}"
    );
    assert!(
        out.contains("let __idem_claim = __idem_claim.lease_mode();"),
        "{out}"
    );
    assert!(out.contains(".begin_lease(tx)"), "{out}");
    assert!(
        out.contains("Duration::from_millis(1209600000u64)"),
        "{out}"
    );
}

/// `fingerprint`, `replay` and `max_attempts`: a pooled source, the panic caught so that the
/// attempt is counted, the value encoded for replay and a duplicate's stored one decoded.
#[test]
fn handler_options() {
    let out = assert_snapshot(
        "handler_options",
        quote!(
            key = "msg.id",
            fingerprint = "msg.body",
            replay = true,
            max_attempts = 5,
            scope = "billing::invoice"
        ),
        quote! {
            async fn invoice(tx: &mut Tx<'_, Postgres>, msg: &InvoiceRequested) -> Result<Invoice, Error> {
                let invoice = Invoice::insert(tx, msg).await?;
                Ok(invoice)
            }
        },
    );
    assert!(
        out.contains("tx: impl ::idem::PooledTransact<'__idem_source, '__idem_tx, Postgres>"),
        "{out}"
    );
    // Each option that needs a capability of the database asks for it in a statement of its
    // own, whose error (a database without it) points at the option.
    assert!(
        out.contains("let __idem_claim = __idem_claim.fingerprint(&(msg.body));"),
        "{out}"
    );
    assert!(
        out.contains("let __idem_claim = __idem_claim.replay();"),
        "{out}"
    );
    assert!(
        out.contains("let __idem_claim = __idem_claim.max_attempts(5u32);"),
        "{out}"
    );
    assert!(out.contains(".begin_counted(tx)"), "{out}");
    assert!(out.contains("::idem::__private::catch_unwind("), "{out}");
    assert!(
        out.contains("__idem_run.panicked(__idem_tx, __idem_caught)"),
        "{out}"
    );
    assert!(out.contains("__idem_run.encode(&__idem_result);"), "{out}");
    assert!(
        out.contains("return ::idem::__private::replayed::<Result<Invoice, Error>>(__idem_done)"),
        "{out}"
    );
}

/// A mistake in the options still generates the fn (so call sites do not fail too), beside the
/// error.
#[test]
fn with_an_error() {
    let out = assert_snapshot(
        "with_an_error",
        quote!(key = "msg.id", verison = "msg.version"),
        quote! {
            async fn on_paid(tx: &mut Tx<'_, Sqlite>, msg: &Paid) -> Result<(), sqlx::Error> {
                Ok(())
            }
        },
    );
    assert!(out.contains("compile_error!"), "{out}");
}

/// `tests/snapshots/orders_on_status.rs`, which the book's internals page includes, is the
/// expansion of the handler `on_status` as written in `examples/orders.rs`.
#[test]
fn the_books_snapshot_is_the_expansion_of_the_example() {
    let name = "on_status";
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let example = std::fs::read_to_string(root.join("examples/orders.rs")).expect("the example");
    let file = syn::parse_file(&example).expect("the example parses");
    let handler = file
        .items
        .into_iter()
        .find_map(|item| match item {
            syn::Item::Fn(f) if f.sig.ident == name => Some(f),
            _ => None,
        })
        .unwrap_or_else(|| panic!("examples/orders.rs has no fn `{name}`"));
    let (args, item) = split_attribute(handler);
    assert_snapshot("orders_on_status", args, quote!(#item));
}

/// `#[idempotent(args)] fn` → (`args`, the fn without that attribute).
fn split_attribute(mut item: syn::ItemFn) -> (TokenStream, syn::ItemFn) {
    let at = item
        .attrs
        .iter()
        .position(|a| a.path().is_ident("idempotent"))
        .expect("the fn has #[idempotent]");
    let attr = item.attrs.remove(at);
    let args = attr
        .meta
        .require_list()
        .expect("#[idempotent(...)]")
        .tokens
        .clone();
    (args, item)
}

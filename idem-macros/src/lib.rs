//! The `#[idempotent]` attribute. Implementation detail of [`idem`](https://docs.rs/idem): depend
//! on `idem` and write `#[idem::idempotent(...)]`; its documentation lives there.

mod args;
mod duration;
mod expand;
mod handler;
mod suggest;
#[cfg(test)]
mod tests;

use proc_macro::TokenStream;

/// Makes an async message handler idempotent. See the `idem` crate for the documentation.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(args.into(), item.into()).into()
}

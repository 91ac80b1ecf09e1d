//! `idem`, the operator's command line for idem's idempotency records: see `idem --help`.

/// `println!` for results: a write error returns from the command (a reader that went away, as
/// in `idem stats | head -1`, ends it quietly) instead of panicking.
macro_rules! outln {
    () => {
        $crate::output::line(format_args!(""))?
    };
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))?
    };
}

/// `eprintln!` for progress and prompts: a closed stderr is ignored, never a panic.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod cli;
mod commands;
mod db;
mod error;
mod output;
mod when;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse(); // bad usage: clap prints it and exits 2
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return error::CliError::failure(format!("cannot start: {err}")).report(),
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => err.report(),
    }
}

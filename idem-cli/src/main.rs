//! `idem`, the operator's command line for idem's idempotency records: see `idem --help`.

mod cli;
mod commands;
mod db;
mod error;
mod output;

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

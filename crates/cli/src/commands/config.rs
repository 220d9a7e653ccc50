//! `qwen-burn config --defaults`: the run-config reference.

use anyhow::Result;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print every run-config key with its default and its doc comment, as TOML
    /// (`configs/REFERENCE.toml` holds the same).
    #[arg(long, required = true)]
    pub defaults: bool,
}

pub fn run(_args: Args) -> Result<()> {
    print!("{}", qwen_burn_train::config::reference());
    Ok(())
}

//! `qwen-burn plot`: loss and learning-rate curves of runs, or a JSONL table, as PNG.

use std::path::PathBuf;

use anyhow::Result;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Run directories (several are overlaid).
    #[arg(required_unless_present = "table")]
    pub runs: Vec<PathBuf>,
    /// Output directory (default: RUN/plots for one run); with --table, the PNG file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Plot a JSONL table instead of runs: --x FIELD --y FIELD [--series FIELD].
    #[arg(long, conflicts_with = "runs")]
    pub table: Option<PathBuf>,
    #[arg(long, requires = "table")]
    pub x: Option<String>,
    #[arg(long, requires = "table")]
    pub y: Option<String>,
    #[arg(long, requires = "table")]
    pub series: Option<String>,
    /// Title of a table plot.
    #[arg(long, default_value = "")]
    pub title: String,
    /// Logarithmic y axis (when the values span at least a factor of 10; else linear).
    #[arg(long)]
    pub log_y: bool,
}

pub fn run(args: Args) -> Result<()> {
    if let Some(table) = &args.table {
        let (Some(x), Some(y), Some(out)) = (&args.x, &args.y, &args.out) else {
            anyhow::bail!("--table needs --x FIELD, --y FIELD and --out FILE.png");
        };
        qwen_burn_train::observe::plot::plot_table(
            table,
            x,
            y,
            args.series.as_deref(),
            out,
            &args.title,
            args.log_y,
        )?;
        println!("wrote {}", out.display());
        return Ok(());
    }
    let out = match (&args.out, args.runs.as_slice()) {
        (Some(o), _) => o.clone(),
        (None, [one]) => one.join("plots"),
        (None, _) => anyhow::bail!("several runs: give --out DIR"),
    };
    for path in qwen_burn_train::observe::plot::plot_runs(&args.runs, &out)? {
        println!("wrote {}", path.display());
    }
    Ok(())
}

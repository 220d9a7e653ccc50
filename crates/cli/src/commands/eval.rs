//! `qwen-burn eval`: perplexity and bits per byte of a text in windows of exactly `--context`
//! tokens (`--text`), or a multiple-choice task scored by log-likelihood (`--task`).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use qwen_burn_train::eval::tasks::{TaskOptions, evaluate_task};
use qwen_burn_train::eval::validation::windowed_loss;

use super::{ModelArgs, find_tokenizer};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to measure perplexity and bits per byte on (.gz read transparently).
    #[arg(long, required_unless_present_any = ["task", "pairs", "generate"], conflicts_with_all = ["task", "pairs", "generate"])]
    pub text: Option<PathBuf>,
    /// Multiple-choice task file (JSONL or .parquet; HellaSwag, ARC, PIQA, MMLU or plain
    /// `context`/`choices`/`gold` rows) to score by log-likelihood: prints acc, acc_norm (per character, as
    /// lm-evaluation-harness) and acc_bytes (per UTF-8 byte).
    #[arg(long)]
    pub task: Option<PathBuf>,
    /// Preference pairs (JSONL in TRL's layouts: prompt/chosen/rejected) to rank: prints one
    /// JSON object with `pairs` and `preference_accuracy` (chosen more likely than rejected);
    /// with --reference (or a reference-free --loss), also `loss`, `reward_accuracy` and
    /// `reward_margin`.
    #[arg(long, conflicts_with_all = ["task", "generate"])]
    pub pairs: Option<PathBuf>,
    /// Prompts with reference answers (JSONL or Parquet: prompt/answer, a prompt may be a list
    /// of messages; GSM8K's question/answer) to complete and score: prints `accuracy` (greedy
    /// completions whose reward is 1), the mean reward and length, and with --samples K,
    /// pass@k for k = 1, 2, 4, ..., K (the unbiased estimator).
    #[arg(long, conflicts_with = "task")]
    pub generate: Option<PathBuf>,
    /// With --generate: `exact_match` (the final answer, `#### N` or the last number, against
    /// `answer`) or `regex` (1 when --pattern matches).
    #[arg(long, requires = "generate", default_value = "exact_match", value_parser = ["exact_match", "regex"])]
    pub reward: String,
    /// With --generate: exact_match's answer regex (first group at the last match), or
    /// regex's pattern.
    #[arg(long, requires = "generate")]
    pub pattern: Option<String>,
    /// With --generate: sampled completions a prompt, for pass@k (0: greedy only).
    #[arg(long, requires = "generate", default_value_t = 0)]
    pub samples: usize,
    /// With --generate: tokens a completion may have.
    #[arg(long, requires = "generate", default_value_t = 64, value_parser = super::positive)]
    pub max_new_tokens: usize,
    /// With --generate and --samples: the sampling temperature.
    #[arg(long, requires = "samples", default_value_t = 1.0)]
    pub temperature: f64,
    /// With --pairs: the reference model (a path or hub id) of the preference loss and rewards.
    #[arg(long, requires = "pairs")]
    pub reference: Option<PathBuf>,
    /// With --pairs: the preference loss (sigmoid, hinge, ipo and robust need --reference;
    /// simpo and orpo need none).
    #[arg(long, requires = "pairs", value_parser = preference_loss)]
    pub loss: Option<qwen_burn_train::config::PreferenceLoss>,
    /// With --pairs: the loss's beta.
    #[arg(long, requires = "pairs", default_value_t = 0.1)]
    pub beta: f64,
    /// With --pairs and --loss simpo: SimPO's gamma (default 0.5).
    #[arg(long, requires = "loss")]
    pub gamma: Option<f64>,
    /// With --pairs: the weight of the chosen completions' token-mean NLL added to the loss
    /// (RPO, `preference.sft_weight`; sigmoid, hinge, ipo and robust).
    #[arg(long, requires = "pairs", default_value_t = 0.0)]
    pub sft_weight: f64,
    /// With --task: few-shot examples before each question, drawn from the task's other
    /// questions.
    #[arg(long, default_value_t = 0, requires = "task")]
    pub shots: usize,
    /// With --task: take the few-shot examples from this file (a train or dev split in the
    /// task's layout) instead of the task's other questions, as lm-evaluation-harness does.
    #[arg(long, requires = "task")]
    pub fewshot_file: Option<PathBuf>,
    /// With --fewshot-file: `random` (a seeded draw) or `first_n` (the file's first --shots
    /// questions: the harness's MMLU examples, exactly).
    #[arg(long, requires = "fewshot_file", default_value = "random", value_parser = ["random", "first_n"])]
    pub fewshot_sampler: String,
    /// With --task or --generate: score only the first N questions or prompts.
    #[arg(long, value_parser = super::positive)]
    pub limit: Option<usize>,
    /// With --task: seed of the few-shot draw; with --generate, of the samples.
    #[arg(long, default_value_t = 1234)]
    pub seed: u64,
    /// With --task: questions whose prompts run in one forward pass (their choices in a second);
    /// lower it to use less memory.
    #[arg(long, default_value_t = qwen_burn_train::eval::tasks::DEFAULT_BATCH, requires = "task", value_parser = super::positive)]
    pub batch_questions: usize,
    /// With --task or --generate: print the metrics as one JSON object (default: a line of
    /// text).
    #[arg(long)]
    pub json: bool,
    /// With --task: write each question's tokens, log-likelihoods and prediction to this JSONL
    /// file; with --generate, each prompt's greedy completion, reward and (with --samples)
    /// count of correct samples.
    #[arg(long)]
    pub records: Option<PathBuf>,
    /// tokenizer.json (default: next to the model).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// With --pairs or --generate: extra variables for the chat template of conversational
    /// lines, as a JSON object ('{"enable_thinking": false}': Qwen3's non-thinking prompts).
    #[arg(long, value_parser = super::template_kwargs)]
    pub chat_template_kwargs: Option<qwen_burn_data::TemplateKwargs>,
    /// Tokens per window (default: the model's max_position_embeddings, at most 1024).
    #[arg(long, value_parser = super::positive)]
    pub context: Option<usize>,
    /// Windows per forward pass.
    #[arg(long, default_value_t = 4, value_parser = super::positive)]
    pub batch_size: usize,
    /// Score at most the first N tokens of the text.
    #[arg(long, requires = "text", value_parser = super::positive)]
    pub max_tokens: Option<usize>,
    /// Also report the loss by position inside the window, in buckets of N positions
    /// (`loss_by_position`): shows how a model does beyond the context it was trained at.
    #[arg(long, requires = "text", value_parser = super::positive)]
    pub bucket: Option<usize>,
}

/// `--records`, checked before any work: not a file the command reads (the task, the model's
/// directory or files, the tokenizer), not a directory, and in a directory that exists. It is
/// written through a temporary file beside it, renamed when complete.
fn check_records(args: &Args) -> Result<()> {
    let Some(out) = &args.records else {
        return Ok(());
    };
    if args.task.is_none() && args.generate.is_none() {
        bail!("--records writes the records of --task or --generate; give one of them");
    }
    let inputs = [
        args.task.as_deref(),
        args.generate.as_deref(),
        args.text.as_deref(),
        args.tokenizer.as_deref(),
        Some(args.model.model.as_path()),
    ];
    let inputs: Vec<&std::path::Path> = inputs.into_iter().flatten().collect();
    super::outputs::check_file_out("--records", out, &inputs)
}

/// One JSON line per record into `out`, through a temporary file renamed when complete.
pub(super) fn write_records<T: serde::Serialize>(
    out: &std::path::Path,
    records: &[T],
) -> Result<()> {
    super::outputs::write_atomic(out, |file| {
        for r in records {
            serde_json::to_writer(&mut *file, r)?;
            writeln!(file)?;
        }
        Ok(())
    })
}

pub fn run(args: Args) -> Result<()> {
    check_records(&args)?;
    if args.chat_template_kwargs.is_some() && args.pairs.is_none() && args.generate.is_none() {
        bail!("--chat-template-kwargs is read with --pairs or --generate only");
    }
    let (model, device) = args.model.load()?;
    let tok = find_tokenizer(&args.model.model, args.tokenizer.as_deref())?
        .context("no tokenizer.json next to the model; pass --tokenizer")?;
    if let Some(task) = &args.task {
        return run_task(&args, task, &model, &tok, &device);
    }
    if let Some(prompts) = &args.generate {
        let generate = super::generation::GenerateArgs {
            reward: &args.reward,
            pattern: args.pattern.as_deref(),
            limit: args.limit,
            max_new_tokens: args.max_new_tokens,
            temperature: args.temperature,
            samples: args.samples,
            seed: args.seed,
            json: args.json,
            records: args.records.as_deref(),
            template_kwargs: args.chat_template_kwargs.as_ref(),
        };
        return super::generation::run_generate(&generate, prompts, &model, &tok, &device);
    }
    if let Some(pairs) = &args.pairs {
        let pairs_args = super::pairs::PairsArgs {
            pairs,
            reference: args.reference.as_deref(),
            loss: args.loss,
            beta: args.beta,
            gamma: args.gamma,
            sft_weight: args.sft_weight,
            batch_pairs: args.batch_size,
            template_kwargs: args.chat_template_kwargs.as_ref(),
        };
        let load = |path: &std::path::Path| {
            let path = qwen_burn_model::hub::resolve(path)?;
            let reference = qwen_burn_train::run::checkpoint::load_model_any(&path, &device)
                .with_context(|| format!("loading the reference {}", path.display()))?;
            Ok(args.model.dtype.apply(reference))
        };
        return super::pairs::run_pairs(&pairs_args, &model, &tok, &device, load);
    }
    let path = args
        .text
        .as_ref()
        .context("give --text FILE or --task FILE")?;
    let text = qwen_burn_data::ingest::read_text_file(path)
        .with_context(|| format!("reading {}", path.display()))?;
    // A tokenizer with more tokens than the model has embeddings would index past them.
    let (tok_vocab, model_vocab) = (tok.vocab_size(), model.config.vocab_size);
    if tok_vocab > model_vocab {
        bail!(
            "tokenizer {} has {tok_vocab} tokens but the model's vocab_size is {model_vocab}: it \
             is not this model's tokenizer",
            tok.path().display()
        );
    }
    let mut ids = tok.encode(&text)?;
    if let Some(max) = args.max_tokens {
        ids.truncate(max);
    }
    let context = args
        .context
        .unwrap_or(model.config.max_position_embeddings.min(1024));
    // Before the first forward: its logits grow with --batch-size x --context x vocab_size
    // (a batch holds at most the text's windows; none is windowed_loss's own error).
    let rows = args.batch_size.min(ids.len() / context.max(1));
    if rows > 0 {
        model
            .config
            .forward_estimate(rows, context, "--batch-size x --context")
            .check("eval --text's forward")?;
    }
    let show = std::io::stderr().is_terminal();
    let result = windowed_loss(
        &model,
        &ids,
        context,
        args.batch_size,
        args.bucket,
        Some(&tok.token_bytes()),
        &device,
        |scored| {
            if show {
                eprint!("\reval: {scored} predictions scored");
            }
        },
    )
    .with_context(|| format!("evaluating {}", path.display()))?;
    if show {
        eprintln!();
    }
    super::require_finite(&model, result.loss, "loss")?;
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}

fn run_task(
    args: &Args,
    path: &std::path::Path,
    model: &qwen_burn_model::Qwen3ForCausalLM,
    tok: &qwen_burn_data::Tok,
    device: &burn::tensor::Device,
) -> Result<()> {
    let mut task = qwen_burn_data::read_task(path)?;
    if let Some(file) = &args.fewshot_file {
        let split = qwen_burn_data::read_task(file)
            .with_context(|| format!("reading the few-shot file {}", file.display()))?;
        let sampler = match args.fewshot_sampler.as_str() {
            "first_n" => qwen_burn_data::FewshotSampler::FirstN,
            _ => qwen_burn_data::FewshotSampler::Random,
        };
        task = task.with_fewshot(split, sampler);
    }
    let opts = TaskOptions {
        shots: args.shots,
        limit: args.limit,
        seed: args.seed,
        batch: args.batch_questions,
    };
    let show = std::io::stderr().is_terminal();
    let total = args
        .limit
        .map_or(task.items.len(), |l| l.min(task.items.len()));
    let (result, scores) = evaluate_task(model, tok, &task, &opts, device, |done| {
        if show {
            eprint!("\reval: {done}/{total} questions");
        }
    })
    .with_context(|| format!("evaluating {}", path.display()))?;
    if show {
        eprintln!();
    }
    if let Some(out) = &args.records {
        write_records(out, &scores)?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!(
            "{} ({}, {} questions, {}-shot): acc {:.4} ± {:.4} | acc_norm {:.4} ± {:.4} | acc_bytes {:.4} ± {:.4} | chance {:.4} | {:.1} s",
            result.task,
            result.layout,
            result.questions,
            result.shots,
            result.acc,
            result.acc_stderr,
            result.acc_norm,
            result.acc_norm_stderr,
            result.acc_bytes,
            result.acc_bytes_stderr,
            result.chance,
            result.seconds
        );
        if result.truncated_questions > 0 {
            println!(
                "note: {} questions had their context cut on the left to fit max_position_embeddings",
                result.truncated_questions
            );
        }
    }
    Ok(())
}

/// `--loss`: a preference loss by its config name.
fn preference_loss(
    s: &str,
) -> std::result::Result<qwen_burn_train::config::PreferenceLoss, String> {
    use qwen_burn_train::config::PreferenceLoss;
    PreferenceLoss::ALL
        .into_iter()
        .find(|l| l.as_str() == s)
        .ok_or_else(|| format!("`{s}`: expected sigmoid, hinge, ipo, robust, simpo or orpo"))
}

//! PNG plots of runs (`qwen-burn plot`), drawn with plotters.
//!
//! The font (DejaVu Sans, Bitstream Vera licence, `assets/`) is embedded so plotting needs no
//! system font library.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};
use serde_json::Value;

use super::records::{MetricsRecord, read_records};
use crate::error::{Result, TrainError};
use qwen_burn_model::RouterStats;

static FONT: Once = Once::new();

fn ensure_font() {
    FONT.call_once(|| {
        let bytes: &'static [u8] = include_bytes!("../../assets/DejaVuSans.ttf");
        if register_font("sans-serif", FontStyle::Normal, bytes).is_err() {
            tracing::warn!("could not register the embedded font; plot labels may be missing");
        }
    });
}

/// One named curve.
pub struct Series {
    /// Legend label.
    pub name: String,
    /// `(x, y)` points in x order.
    pub points: Vec<(f64, f64)>,
}

/// Draw curves into a PNG.
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    log_y: bool,
) -> Result<()> {
    ensure_font();
    let err = |e: String| TrainError::Other(format!("plotting {}: {e}", path.display()));
    let points = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in points.filter(|(_, y)| y.is_finite() && (!log_y || *y > 0.0)) {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        return Err(err("no finite points to plot".into()));
    }
    if x1 == x0 {
        x1 = x0 + 1.0;
    }
    if y1 == y0 {
        y1 = y0 + y0.abs().max(1e-9) * 0.1;
    }
    // Plotters labels a log axis only at powers of ten: a range inside one decade would get no
    // tick labels at all, so such a chart is drawn on a linear axis.
    let log_y = log_y && y1 / y0 >= 10.0;
    let root = BitMapBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let colors = [
        BLUE,
        RED,
        GREEN,
        MAGENTA,
        CYAN,
        BLACK,
        RGBColor(255, 140, 0),
        RGBColor(128, 0, 128),
    ];
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(x_label)
                .y_desc(y_label)
                .draw()
                .map_err(|e| err(e.to_string()))?;
            for (i, s) in series.iter().enumerate() {
                let color = colors[i % colors.len()];
                let pts: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .copied()
                    .filter(|(_, y)| y.is_finite() && (!log_y || *y > 0.0))
                    .collect();
                chart
                    .draw_series(LineSeries::new(pts, color.stroke_width(2)))
                    .map_err(|e| err(e.to_string()))?
                    .label(s.name.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(e.to_string()))?;
        }};
    }
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70);
    if log_y {
        draw!(
            builder
                .build_cartesian_2d(x0..x1, (y0 * 0.95..y1 * 1.05).log_scale())
                .map_err(|e| err(e.to_string()))?
        );
    } else {
        let pad = (y1 - y0) * 0.05;
        draw!(
            builder
                .build_cartesian_2d(x0..x1, (y0 - pad)..(y1 + pad))
                .map_err(|e| err(e.to_string()))?
        );
    }
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

/// `(step, value)` of `field` in the training (`val = false`) or validation records.
pub fn metric_points(records: &[MetricsRecord], val: bool, field: &str) -> Vec<(f64, f64)> {
    records
        .iter()
        .filter(|r| matches!(r, MetricsRecord::Val(_)) == val)
        .filter_map(|r| Some((r.step() as f64, r.field(field)?)))
        .filter(|(_, y)| y.is_finite())
        .collect()
}

fn run_name(dir: &Path) -> String {
    dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().to_string(),
    )
}

/// Write `loss.png` and `lr.png` (and `bpb.png` when validation recorded bits per byte,
/// `tasks.png` for runs with `[eval] tasks`, `moe_load.png` for MoE runs, and
/// `figures/<name>.png` for each of the objective's figures, `/` written `_`: a preference or
/// RL run's rewards) for one or more runs into `out_dir`; several runs are overlaid. Returns
/// the files written.
pub fn plot_runs(runs: &[PathBuf], out_dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out_dir).map_err(|e| TrainError::io("create directory", out_dir, e))?;
    let mut loss = Vec::new();
    let mut lr = Vec::new();
    let mut load = Vec::new();
    let mut bpb = Vec::new();
    let mut tasks = Vec::new();
    // The objective's figures by name: train and validation series of every run.
    let mut figures: std::collections::BTreeMap<String, Vec<Series>> = Default::default();
    for run in runs {
        let records = read_records(&run.join("metrics.jsonl"))?;
        let name = run_name(run);
        let prefix = if runs.len() > 1 {
            format!("{name} ")
        } else {
            String::new()
        };
        loss.push(Series {
            name: format!("{prefix}train"),
            points: metric_points(&records, false, "loss"),
        });
        let val = metric_points(&records, true, "loss");
        if !val.is_empty() {
            loss.push(Series {
                name: format!("{prefix}val"),
                points: val,
            });
        }
        lr.push(Series {
            name: name.clone(),
            points: metric_points(&records, false, "lr"),
        });
        let val_bpb = metric_points(&records, true, "bpb");
        if !val_bpb.is_empty() {
            bpb.push(Series {
                name: format!("{prefix}val"),
                points: val_bpb,
            });
        }
        for r in &records {
            let (split, names) = match r {
                MetricsRecord::Train(t) => ("train", &t.figures),
                MetricsRecord::Val(v) => ("val", &v.figures),
                MetricsRecord::Task(_) => continue,
            };
            for name in names.keys() {
                let series = figures.entry(name.clone()).or_default();
                let label = format!("{prefix}{split}");
                if !series.iter().any(|s| s.name == label) {
                    series.push(Series {
                        name: label,
                        points: metric_points(&records, split == "val", name),
                    });
                }
            }
        }
        // Multiple-choice tasks: acc and acc_norm per task, and the chance level.
        let mut names: Vec<&str> = Vec::new();
        for r in &records {
            if let MetricsRecord::Task(t) = r
                && !names.contains(&t.task.as_str())
            {
                names.push(&t.task);
            }
        }
        for task in names {
            let of_task = || {
                records.iter().filter_map(move |r| match r {
                    MetricsRecord::Task(t) if t.task == task => Some(t),
                    _ => None,
                })
            };
            tasks.push(Series {
                name: format!("{prefix}{task} acc"),
                points: of_task().map(|t| (t.step as f64, t.acc)).collect(),
            });
            tasks.push(Series {
                name: format!("{prefix}{task} acc_norm"),
                points: of_task().map(|t| (t.step as f64, t.acc_norm)).collect(),
            });
            if runs.len() == 1 {
                tasks.push(Series {
                    name: format!("{task} chance"),
                    points: of_task().map(|t| (t.step as f64, t.chance)).collect(),
                });
            }
        }
        // Per-layer max/mean expert load of MoE runs: the router's own choice, and under a
        // capacity the capped assignment beside it.
        let pick = |capped: bool| -> Vec<(f64, &Vec<RouterStats>)> {
            records
                .iter()
                .filter_map(|r| match r {
                    MetricsRecord::Train(t) if capped => {
                        Some((t.step as f64, t.moe_capped.as_ref()?))
                    }
                    MetricsRecord::Train(t) => Some((t.step as f64, t.moe_router.as_ref()?)),
                    _ => None,
                })
                .collect()
        };
        for (capped, what) in [(false, "router"), (true, "capped")] {
            let moe = pick(capped);
            let layers = moe.first().map_or(0, |(_, layers)| layers.len());
            for layer in 0..layers {
                let points = moe
                    .iter()
                    .filter_map(|(step, l)| Some((*step, l.get(layer)?.max_over_mean_load)))
                    .collect();
                load.push(Series {
                    name: format!("{prefix}layer {layer} ({what})"),
                    points,
                });
            }
        }
    }
    let mut written = Vec::new();
    let path = out_dir.join("loss.png");
    line_chart(&path, "loss", "step", "cross-entropy (nats)", &loss, false)?;
    written.push(path);
    let path = out_dir.join("lr.png");
    line_chart(&path, "learning rate", "step", "lr", &lr, false)?;
    written.push(path);
    if !bpb.is_empty() {
        let path = out_dir.join("bpb.png");
        line_chart(
            &path,
            "validation bits per byte",
            "step",
            "bits per byte",
            &bpb,
            false,
        )?;
        written.push(path);
    }
    if !tasks.is_empty() {
        let path = out_dir.join("tasks.png");
        line_chart(
            &path,
            "multiple-choice tasks",
            "step",
            "accuracy",
            &tasks,
            false,
        )?;
        written.push(path);
    }
    if !load.is_empty() {
        let path = out_dir.join("moe_load.png");
        line_chart(
            &path,
            "MoE expert load: router's own choice (and capped assignment)",
            "step",
            "max / mean tokens per expert",
            &load,
            false,
        )?;
        written.push(path);
    }
    if !figures.is_empty() {
        let dir = out_dir.join("figures");
        std::fs::create_dir_all(&dir).map_err(|e| TrainError::io("create directory", &dir, e))?;
        for (name, series) in &figures {
            let path = dir.join(format!("{}.png", name.replace('/', "_")));
            line_chart(&path, name, "step", name, series, false)?;
            written.push(path);
        }
    }
    Ok(written)
}

/// Plot any JSONL table: one curve per distinct value of `series_field`, `x_field` against
/// `y_field` (experiments use it for results that are not per-step, e.g. perplexity against
/// context length).
pub fn plot_table(
    table: &Path,
    x_field: &str,
    y_field: &str,
    series_field: Option<&str>,
    out: &Path,
    title: &str,
    log_y: bool,
) -> Result<()> {
    let text = std::fs::read_to_string(table).map_err(|e| TrainError::io("read", table, e))?;
    let records: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let mut series: Vec<Series> = Vec::new();
    for r in &records {
        let (Some(x), Some(y)) = (r[x_field].as_f64(), r[y_field].as_f64()) else {
            continue;
        };
        let name = series_field
            .map(|f| match &r[f] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .unwrap_or_else(|| y_field.to_string());
        match series.iter_mut().find(|s| s.name == name) {
            Some(s) => s.points.push((x, y)),
            None => series.push(Series {
                name,
                points: vec![(x, y)],
            }),
        }
    }
    for s in &mut series {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).map_err(|e| TrainError::io("create directory", dir, e))?;
    }
    line_chart(out, title, x_field, y_field, &series, log_y)
}

//! Few-shot examples of a multiple-choice task ([`McTask::context`]): from the task's other
//! questions, or from a train or dev split ([`McTask::with_fewshot`]) with
//! lm-evaluation-harness's samplers.

use rand::SeedableRng;
use rand::seq::index::sample;
use rand_chacha::ChaCha8Rng;

use crate::error::{DataError, Result};
use crate::tasks::{Fewshot, FewshotSampler, McTask};

impl McTask {
    /// The task with its few-shot examples taken from `split` (read with [`read_task`]) by
    /// `sampler`, as the harness takes them from a train or dev split.
    pub fn with_fewshot(mut self, split: McTask, sampler: FewshotSampler) -> Self {
        self.fewshot = Some(Fewshot {
            path: split.path,
            items: split.items,
            sampler,
        });
        self
    }

    /// The context of question `index` with `shots` examples: the description, the examples,
    /// then the prompt. The examples come from the few-shot split when there is one
    /// ([`McTask::with_fewshot`]), else from the task's other questions.
    ///
    /// A random draw is without replacement, seeded by `seed` and `index` alone, so a question
    /// gets the same examples whatever `--limit` or the order of evaluation.
    pub fn context(&self, index: usize, shots: usize, seed: u64) -> Result<String> {
        let item = &self.items[index];
        if let Some(f) = &self.fewshot {
            if shots > f.items.len() {
                return Err(DataError::option(
                    "shots",
                    format!(
                        "{shots} few-shot examples asked for, but the few-shot file {} has only {}",
                        f.path.display(),
                        f.items.len()
                    ),
                ));
            }
            let mut text = item.description.clone();
            let picked: Vec<usize> = match f.sampler {
                FewshotSampler::FirstN => (0..shots).collect(),
                FewshotSampler::Random => {
                    let mut rng = ChaCha8Rng::seed_from_u64(
                        seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                    );
                    sample(&mut rng, f.items.len(), shots).into_iter().collect()
                }
            };
            for j in picked {
                text.push_str(&f.items[j].as_example());
            }
            text.push_str(&item.prompt);
            return Ok(text);
        }
        let others = self.items.len() - 1;
        if shots > others {
            return Err(DataError::option(
                "shots",
                format!(
                    "{shots} few-shot examples asked for, but {} has only {others} other \
                     questions to draw them from",
                    self.path.display()
                ),
            ));
        }
        let mut text = item.description.clone();
        if shots > 0 {
            let mut rng = ChaCha8Rng::seed_from_u64(
                seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            );
            for j in sample(&mut rng, others, shots) {
                // Skip the question itself: draws 0..others map onto every index but `index`.
                let j = if j >= index { j + 1 } else { j };
                text.push_str(&self.items[j].as_example());
            }
        }
        text.push_str(&item.prompt);
        Ok(text)
    }
}

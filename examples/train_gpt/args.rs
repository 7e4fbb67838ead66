//! `train_gpt`'s command line. Pure host code.

use crate::GptError;
use gpubind::blas::AlgoSelection;
use std::path::PathBuf;

/// The arithmetic of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// f32 everywhere, TF32 off.
    Fp32,
    /// bf16 activations, gradients and products (f32 accumulation); f32 master weights,
    /// AdamW moments, layer-norm statistics, losses and reductions.
    Bf16,
}

/// How a block's attention runs (`--attention`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnMode {
    /// The default: `Fused` in bf16, `Unfused` in fp32 (where cuBLAS's f32 products of
    /// the whole `T×T` matrix outrun the fused kernels' FMA loops).
    Auto,
    /// Fused kernels: in bf16 the register-tiled mma.sync ones (`attention_mma.cu`), in
    /// fp32 the shared-memory tiled ones (`attention.cu`).
    Fused,
    /// The shared-memory tiled kernels (`attention.cu`: wmma in bf16, FMA in fp32).
    Tiled,
    /// Batched products through a `B·NH·T·T` matrix and a softmax kernel (llm.c's).
    Unfused,
}

impl AttnMode {
    /// The mode a run with bf16 activations (`bf16`) or f32 ones uses.
    pub fn resolve(self, bf16: bool) -> AttnMode {
        match self {
            AttnMode::Auto if bf16 => AttnMode::Fused,
            AttnMode::Auto => AttnMode::Unfused,
            other => other,
        }
    }
}

/// Which implementations a step uses (`--attention`, `--epilogues`, `--gemm-algos`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fusion {
    pub attention: AttnMode,
    /// Biases, GELU and their gradients as cuBLASLt epilogues of the products (`on`), or
    /// as kernels of their own (`off`).
    pub epilogues: bool,
    /// How the cuBLASLt products pick their algorithms: the fastest of cuBLASLt's
    /// candidates, timed on the first step (`timed`), or its heuristic's first
    /// (`heuristic`: the same algorithms in every process).
    pub gemm_algos: AlgoSelection,
}

#[derive(Debug, Clone)]
pub struct Args {
    pub model: String,
    pub batch: usize,
    pub steps: usize,
    pub lr: f64,
    pub seed: u64,
    pub data: Vec<PathBuf>,
    pub eval_every: usize,
    pub eval_batches: usize,
    pub sample: usize,
    pub dump_init: Option<PathBuf>,
    pub precision: Precision,
    pub graph: bool,
    pub fusion: Fusion,
    pub ckpt_every: usize,
    pub ckpt_dir: PathBuf,
    pub resume: Option<PathBuf>,
    pub log_every: usize,
    pub devices: Vec<usize>,
    pub launcher_env: bool,
    /// Train with a checkpoint halfway, resume from it, and check the losses repeat.
    pub check_resume: bool,
    /// Train eagerly, then through CUDA graphs, and check the losses are equal.
    pub check_graph: bool,
    /// With several ranks: train one rank first and compare the losses.
    pub check_dp: bool,
    /// Compare the fused attention with the unfused one on random inputs, and time both.
    pub check_attention: bool,
    /// With `check_attention`: only the small shapes, untimed (`--check-attention-quick`,
    /// short enough to run under compute-sanitizer).
    pub check_quick: bool,
    /// Print the largest batch whose buffers fit in the free device memory, and exit.
    pub max_batch: bool,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            model: "small".into(),
            batch: 8,
            steps: 100,
            lr: 6e-4,
            seed: 1,
            data: Vec::new(),
            eval_every: 0,
            eval_batches: 8,
            sample: 0,
            dump_init: None,
            precision: Precision::Fp32,
            graph: false,
            fusion: Fusion {
                attention: AttnMode::Auto,
                epilogues: true,
                gemm_algos: AlgoSelection::timed(),
            },
            ckpt_every: 0,
            ckpt_dir: PathBuf::from("checkpoints"),
            resume: None,
            log_every: 10,
            devices: vec![0],
            launcher_env: false,
            check_resume: false,
            check_graph: false,
            check_dp: false,
            check_attention: false,
            check_quick: false,
            max_batch: false,
        }
    }
}

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, GptError>
where
    T::Err: std::fmt::Display,
{
    v.parse()
        .map_err(|e| GptError::Usage(format!("{flag} {v:?}: {e}")))
}

/// Parses the arguments after the program name.
pub fn parse(argv: impl IntoIterator<Item = String>) -> Result<Args, GptError> {
    let mut a = Args::default();
    let mut it = argv.into_iter().peekable();
    while let Some(flag) = it.next() {
        if flag == "--data" {
            while let Some(p) = it.next_if(|p| !p.starts_with("--")) {
                a.data.push(p.into());
            }
            if a.data.is_empty() {
                return Err(GptError::Usage("--data needs at least one path".into()));
            }
            continue;
        }
        let bool_flag = matches!(
            flag.as_str(),
            "--graph"
                | "--check-resume"
                | "--check-graph"
                | "--check-dp"
                | "--check-attention"
                | "--check-attention-quick"
                | "--max-batch"
        );
        let v = if bool_flag {
            String::new()
        } else {
            it.next()
                .ok_or_else(|| GptError::Usage(format!("{flag} needs a value")))?
        };
        match flag.as_str() {
            "--model" => a.model = v,
            "--batch" => a.batch = num(&flag, &v)?,
            "--steps" => a.steps = num(&flag, &v)?,
            "--lr" => a.lr = num(&flag, &v)?,
            "--seed" => a.seed = num(&flag, &v)?,
            "--eval-every" => a.eval_every = num(&flag, &v)?,
            "--eval-batches" => a.eval_batches = num(&flag, &v)?,
            "--sample" => a.sample = num(&flag, &v)?,
            "--dump-init" => a.dump_init = Some(v.into()),
            "--precision" => {
                a.precision = match v.as_str() {
                    "fp32" => Precision::Fp32,
                    "bf16" => Precision::Bf16,
                    _ => return Err(GptError::Usage(format!("--precision {v:?}: fp32 or bf16"))),
                }
            }
            "--graph" => a.graph = true,
            "--attention" => {
                a.fusion.attention = match v.as_str() {
                    "auto" => AttnMode::Auto,
                    "fused" => AttnMode::Fused,
                    "tiled" => AttnMode::Tiled,
                    "unfused" => AttnMode::Unfused,
                    _ => {
                        return Err(GptError::Usage(format!(
                            "--attention {v:?}: auto, fused, tiled or unfused"
                        )));
                    }
                }
            }
            "--epilogues" => {
                a.fusion.epilogues = match v.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => return Err(GptError::Usage(format!("--epilogues {v:?}: on or off"))),
                }
            }
            "--gemm-algos" => {
                let max = AlgoSelection::MAX_CANDIDATES;
                let count = |n: &str| n.parse::<u32>().ok().filter(|n| (1..=max).contains(n));
                a.fusion.gemm_algos = match v.as_str() {
                    "timed" => AlgoSelection::timed(),
                    "heuristic" => AlgoSelection::Heuristic,
                    _ => match v.strip_prefix("timed:").and_then(count) {
                        Some(candidates) => AlgoSelection::Timed { candidates },
                        None => {
                            return Err(GptError::Usage(format!(
                                "--gemm-algos {v:?}: timed, timed:N (N = 1 to {max} candidates) \
                                 or heuristic"
                            )));
                        }
                    },
                }
            }
            "--check-attention" => a.check_attention = true,
            "--check-attention-quick" => {
                a.check_attention = true;
                a.check_quick = true;
            }
            "--max-batch" => a.max_batch = true,
            "--check-resume" => a.check_resume = true,
            "--check-graph" => a.check_graph = true,
            "--check-dp" => a.check_dp = true,
            "--ckpt-every" => a.ckpt_every = num(&flag, &v)?,
            "--ckpt-dir" => a.ckpt_dir = v.into(),
            "--resume" => a.resume = Some(v.into()),
            "--log-every" => a.log_every = num(&flag, &v)?,
            "--devices" => {
                a.devices = v
                    .split(',')
                    .map(|s| num("--devices", s.trim()))
                    .collect::<Result<_, _>>()?
            }
            "--launcher" if v == "env" => a.launcher_env = true,
            "--launcher" => return Err(GptError::Usage(format!("--launcher {v:?}: only env"))),
            other => return Err(GptError::Usage(format!("unknown argument {other:?}"))),
        }
    }
    if a.batch == 0 || a.steps == 0 || a.log_every == 0 {
        return Err(GptError::Usage(
            "--batch, --steps and --log-every must be positive".into(),
        ));
    }
    if !(a.lr.is_finite() && a.lr > 0.0) {
        return Err(GptError::Usage(format!("--lr {}: must be positive", a.lr)));
    }
    if a.devices.is_empty() {
        return Err(GptError::Usage(
            "--devices needs at least one ordinal".into(),
        ));
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Args, GptError> {
        parse(s.split_whitespace().map(String::from))
    }

    #[test]
    fn defaults_and_flags() {
        let a = p("").unwrap();
        assert_eq!((a.model.as_str(), a.batch, a.steps), ("small", 8, 100));
        let a =
            p("--model gpt2 --batch 16 --steps 5 --lr 3e-4 --graph --data a.txt b.txt --seed 9")
                .unwrap();
        assert_eq!(a.model, "gpt2");
        assert_eq!((a.batch, a.steps, a.seed), (16, 5, 9));
        assert!(a.graph);
        assert_eq!(a.data, [PathBuf::from("a.txt"), PathBuf::from("b.txt")]);
        assert_eq!(p("--devices 0,0").unwrap().devices, [0, 0]);
        assert!(p("--check-resume --steps 4").unwrap().check_resume);
        assert!(p("--check-graph").unwrap().check_graph);
        assert!(p("--check-dp --devices 0,0").unwrap().check_dp);
        assert_eq!(p("--precision bf16").unwrap().precision, Precision::Bf16);
        assert_eq!(a.fusion.attention, AttnMode::Auto);
        assert_eq!(AttnMode::Auto.resolve(true), AttnMode::Fused);
        assert_eq!(AttnMode::Auto.resolve(false), AttnMode::Unfused);
        assert_eq!(AttnMode::Tiled.resolve(true), AttnMode::Tiled);
        assert!(a.fusion.epilogues);
        let u = p("--attention unfused --epilogues off --check-attention").unwrap();
        assert_eq!(u.fusion.attention, AttnMode::Unfused);
        assert!(!u.fusion.epilogues);
        assert_eq!(a.fusion.gemm_algos, AlgoSelection::timed());
        let h = p("--gemm-algos heuristic").unwrap();
        assert_eq!(h.fusion.gemm_algos, AlgoSelection::Heuristic);
        assert!(p("--gemm-algos fastest").is_err());
        let t = p("--gemm-algos timed:16").unwrap();
        assert_eq!(t.fusion.gemm_algos, AlgoSelection::Timed { candidates: 16 });
        for bad in ["timed:0", "timed:17", "timed:", "timed:x"] {
            assert!(p(&format!("--gemm-algos {bad}")).is_err(), "{bad}");
        }
        let t = p("--attention tiled").unwrap();
        assert_eq!(t.fusion.attention, AttnMode::Tiled);
        assert!(u.check_attention && !u.check_quick);
        let q = p("--check-attention-quick").unwrap();
        assert!(q.check_attention && q.check_quick);
        // A flag without a value: the next argument stays an argument.
        let m = p("--max-batch --model gpt2").unwrap();
        assert!(m.max_batch && m.model == "gpt2" && !a.max_batch);
    }

    #[test]
    fn bad_input_is_a_usage_error() {
        for bad in [
            "--batch 0",
            "--batch x",
            "--frobnicate 1",
            "--steps",
            "--data",
            "--precision fp8",
            "--lr -1",
            "--launcher slurm",
            "--attention flash",
            "--attention",
            "--epilogues yes",
        ] {
            assert!(matches!(p(bad), Err(GptError::Usage(_))), "{bad}");
        }
    }
}

//! The launcher's environment: which launcher started this process, its rank and world,
//! rank 0's address, the rendezvous port and timeout ([`LaunchEnv::from_env`]).

use crate::collective::support::MAX_PROCESS_WORLD;
use crate::config;
use crate::error::{Error, Result};
use std::time::Duration;

/// Which launcher's variables a [`LaunchEnv`] was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Launcher {
    /// `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`: torchrun and the
    /// launchers that copy it (`torch.distributed.launch`, DeepSpeed, Accelerate).
    Torch,
    /// Open MPI's `mpirun`: `OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`, `_LOCAL_SIZE`.
    OpenMpi,
    /// MPICH / Intel MPI (Hydra): `PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`,
    /// `MPI_LOCALNRANKS`.
    Mpich,
    /// Slurm's `srun`: `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`,
    /// `SLURM_NTASKS_PER_NODE` (when a plain number), `SLURM_NNODES`.
    Slurm,
}

/// `(launcher, rank, world size, local rank, local world size)` variables, in the order
/// they are tried: the first launcher whose rank variable is set wins.
///
/// torchrun first: under `srun torchrun …` the Slurm variables describe the torchrun
/// agent, not the worker. MPI before Slurm: under `mpirun` in a Slurm allocation,
/// `SLURM_PROCID` belongs to the MPI daemon of the node.
const LAUNCHERS: [(Launcher, &str, &str, &str, &str); 4] = [
    (
        Launcher::Torch,
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
    ),
    (
        Launcher::OpenMpi,
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    (
        Launcher::Mpich,
        "PMI_RANK",
        "PMI_SIZE",
        "MPI_LOCALRANKID",
        "MPI_LOCALNRANKS",
    ),
    (
        Launcher::Slurm,
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_LOCALID",
        "SLURM_NTASKS_PER_NODE",
    ),
];

/// gpubind's rendezvous port variable.
pub const PORT_VAR: &str = config::RDZV_PORT.name;
/// gpubind's rendezvous timeout variable (seconds, may have a fraction).
pub const TIMEOUT_VAR: &str = config::RDZV_TIMEOUT.name;
/// The port when neither `GPUBIND_RDZV_PORT` nor `MASTER_PORT` is set: PyTorch's
/// default `MASTER_PORT` (29500) plus one.
pub const DEFAULT_PORT: u16 = 29501;
/// gpubind's variable that turns the agreement on every NCCL collective across processes
/// off (`0`, `false`, `off`, `no`) or on (`1`, `true`, `on`, `yes`; the default): see
/// [`LaunchEnv::check_calls`].
pub const CHECK_VAR: &str = config::CHECK_CALLS.name;
/// The rendezvous (and NCCL init) timeout when `GPUBIND_RDZV_TIMEOUT` is not set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Where this process sits in a multi-process job, read from the launcher's environment
/// ([`from_env`](Self::from_env)); see docs/collective.md, "Deployment".
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LaunchEnv {
    /// Whose variables these are.
    pub launcher: Launcher,
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    /// Number of ranks (processes) in the job.
    pub world_size: usize,
    /// This process's index on its machine: the usual device ordinal to use.
    pub local_rank: usize,
    /// Processes on this machine, when the launcher says.
    pub local_world_size: Option<usize>,
    /// Rank 0's host (`MASTER_ADDR`; `127.0.0.1` for a one-machine job without it).
    pub master_addr: String,
    /// The port rank 0 serves the id on (`GPUBIND_RDZV_PORT`, else `MASTER_PORT + 1`,
    /// else [`DEFAULT_PORT`]).
    pub port: u16,
    /// Bound on every wait of the rendezvous and of NCCL's initialisation
    /// (`GPUBIND_RDZV_TIMEOUT` seconds, else [`DEFAULT_TIMEOUT`]).
    pub timeout: Duration,
    /// Whether [`RankComm::from_launch`](crate::collective::RankComm::from_launch) makes the ranks
    /// agree on every collective (op, type, length, root) through rank 0 before NCCL
    /// enqueues it, so that a mismatch is the same typed error on every rank instead of
    /// a hang or corrupt data (`GPUBIND_CHECK_CALLS`, default on; it costs one round
    /// trip to rank 0 per collective: docs/collective.md, "Ranks agree before NCCL
    /// enqueues"). Every rank must use the same setting (checked at the rendezvous).
    pub check_calls: bool,
}

fn env_err(variable: &str, reason: impl Into<String>) -> Error {
    Error::LaunchEnv {
        variable: variable.to_owned(),
        reason: reason.into(),
    }
}

impl LaunchEnv {
    /// Every variable [`from_vars`](Self::from_vars) may read: what a wrapper that starts
    /// ranks itself, or a test, clears so that an outer launcher's values cannot leak in.
    pub const VARIABLES: &'static [&'static str] = &[
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "PMI_RANK",
        "PMI_SIZE",
        "MPI_LOCALRANKID",
        "MPI_LOCALNRANKS",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_LOCALID",
        "SLURM_NTASKS_PER_NODE",
        "SLURM_NNODES",
        "MASTER_ADDR",
        "MASTER_PORT",
        PORT_VAR,
        TIMEOUT_VAR,
        CHECK_VAR,
    ];

    /// Reads the process environment (see [`from_vars`](Self::from_vars)).
    pub fn from_env() -> Result<LaunchEnv> {
        Self::from_vars(config::env)
    }

    /// Reads the variables through `get` (a name to its value, `None` if unset).
    ///
    /// The first launcher whose rank variable is set supplies rank, world size, local
    /// rank and local world size (torchrun, then Open MPI, then MPICH, then Slurm); its
    /// world size must be set too. Then `MASTER_ADDR`, the port and the timeout (see
    /// the fields). Every missing, unparsable or inconsistent value is
    /// [`Error::LaunchEnv`] naming the variable.
    ///
    /// ```
    /// use gpubind::collective::{LaunchEnv, Launcher};
    /// let vars = [("RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1"),
    ///             ("MASTER_ADDR", "node0"), ("MASTER_PORT", "29500")];
    /// let env = LaunchEnv::from_vars(|k| {
    ///     vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    /// })?;
    /// assert_eq!((env.launcher, env.rank, env.world_size), (Launcher::Torch, 1, 4));
    /// assert_eq!((env.master_addr.as_str(), env.port), ("node0", 29501));
    /// # Ok::<(), gpubind::Error>(())
    /// ```
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv> {
        let get = |name: &str| get(name).map(|v| v.trim().to_owned());
        let number = |name: &str| -> Result<Option<usize>> {
            match get(name) {
                None => Ok(None),
                Some(v) => v
                    .parse::<usize>()
                    .map(Some)
                    .map_err(|_| env_err(name, format!("{v:?} is not a non-negative integer"))),
            }
        };
        let Some(&(launcher, rank_var, world_var, local_var, local_world_var)) =
            LAUNCHERS.iter().find(|l| get(l.1).is_some())
        else {
            return Err(env_err(
                "RANK",
                "no launcher variables found: run under torchrun, mpirun or srun, or set RANK, WORLD_SIZE and LOCAL_RANK (and MASTER_ADDR for more than one machine)",
            ));
        };
        let rank = number(rank_var)?.unwrap_or(0);
        let world_size = number(world_var)?
            .ok_or_else(|| env_err(world_var, format!("not set, but {rank_var} is")))?;
        if world_size == 0 {
            return Err(env_err(world_var, "is 0: a job has at least one rank"));
        }
        if world_size > MAX_PROCESS_WORLD {
            return Err(env_err(
                world_var,
                format!(
                    "{world_size} is more than the {MAX_PROCESS_WORLD} ranks a process can hold a connection to"
                ),
            ));
        }
        if rank >= world_size {
            return Err(env_err(
                rank_var,
                format!("{rank} is out of range for {world_var}={world_size}"),
            ));
        }
        let local_world_size = match launcher {
            // "2(x3)" and lists are legal Slurm values: use only a plain number.
            Launcher::Slurm => get(local_world_var).and_then(|v| v.parse::<usize>().ok()),
            _ => number(local_world_var)?,
        };
        let local_rank = match number(local_var)? {
            Some(l) => l,
            None if world_size == 1 => 0,
            None => {
                return Err(env_err(
                    local_var,
                    format!(
                        "not set, but {rank_var} is: set it to this process's index on its machine (its GPU)"
                    ),
                ));
            }
        };
        if let Some(lw) = local_world_size {
            if lw == 0 || lw > world_size {
                return Err(env_err(
                    local_world_var,
                    format!("{lw} is not in 1..={world_size} ({world_var})"),
                ));
            }
            if local_rank >= lw {
                return Err(env_err(
                    local_var,
                    format!("{local_rank} is out of range for {local_world_var}={lw}"),
                ));
            }
        }
        let single_machine = world_size == 1
            || local_world_size == Some(world_size)
            || (launcher == Launcher::Slurm && get("SLURM_NNODES").as_deref() == Some("1"));
        let master_addr = match get("MASTER_ADDR") {
            Some(a) if !a.is_empty() => a,
            Some(_) => return Err(env_err("MASTER_ADDR", "is empty")),
            None if single_machine => "127.0.0.1".to_owned(),
            None => {
                return Err(env_err(
                    "MASTER_ADDR",
                    "not set, and the job may span machines: set it to rank 0's host name or address (under Slurm: export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1))",
                ));
            }
        };
        let port = port_from(&get)?;
        let check_calls = check_calls_from(&get)?;
        let timeout = timeout_from(&get)?;
        Ok(LaunchEnv {
            launcher,
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            port,
            timeout,
            check_calls,
        })
    }

    /// The same environment with another timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The same environment with the agreement on every collective on or off (see
    /// [`check_calls`](Self::check_calls)).
    pub fn with_call_check(mut self, on: bool) -> Self {
        self.check_calls = on;
        self
    }
}

/// gpubind's rendezvous port: [`PORT_VAR`], else `MASTER_PORT + 1`, else
/// [`DEFAULT_PORT`].
fn port_from(get: &dyn Fn(&str) -> Option<String>) -> Result<u16> {
    let port_of = |name: &str, v: &str| -> Result<u16> {
        match v.parse::<u16>() {
            Ok(p) if p > 0 => Ok(p),
            _ => Err(env_err(
                name,
                format!("{v:?} is not a TCP port (1..=65535)"),
            )),
        }
    };
    let port = match (
        config::rdzv_port(&get).map_err(config::VarError::into_launch_env)?,
        get("MASTER_PORT"),
    ) {
        (Some(p), _) => p,
        (None, Some(v)) => {
            let master = port_of("MASTER_PORT", &v)?;
            master.checked_add(1).ok_or_else(|| {
                env_err(
                    "MASTER_PORT",
                    format!("is 65535, so gpubind's default port (MASTER_PORT + 1) does not exist: set {PORT_VAR}"),
                )
            })?
        }
        (None, None) => DEFAULT_PORT,
    };
    Ok(port)
}

/// Whether the ranks agree on every collective ([`CHECK_VAR`], on by default).
fn check_calls_from(get: &dyn Fn(&str) -> Option<String>) -> Result<bool> {
    config::check_calls(&get).map_err(config::VarError::into_launch_env)
}

/// The rendezvous timeout ([`TIMEOUT_VAR`], seconds), else [`DEFAULT_TIMEOUT`].
fn timeout_from(get: &dyn Fn(&str) -> Option<String>) -> Result<Duration> {
    Ok(config::rdzv_timeout(&get)
        .map_err(config::VarError::into_launch_env)?
        .unwrap_or(DEFAULT_TIMEOUT))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// `VARIABLES` names every variable `from_vars` asks for, on the paths of every
    /// launcher and of the optional variables, and no name twice.
    #[test]
    fn variables_lists_every_variable_read() {
        let mut envs: Vec<Vec<(&str, &str)>> = vec![vec![]];
        for l in LAUNCHERS {
            envs.push(vec![
                (l.1, "0"),
                (l.2, "2"),
                (l.3, "0"),
                // Fewer local ranks than ranks: Slurm then asks how many nodes.
                (l.4, "1"),
                ("SLURM_NNODES", "1"),
                ("MASTER_ADDR", "node0"),
                ("MASTER_PORT", "29500"),
                (PORT_VAR, "29600"),
                (TIMEOUT_VAR, "5"),
                (CHECK_VAR, "1"),
            ]);
        }
        let asked = std::cell::RefCell::new(Vec::<String>::new());
        for pairs in &envs {
            let _ = LaunchEnv::from_vars(|k| {
                asked.borrow_mut().push(k.to_owned());
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            });
        }
        let asked = asked.into_inner();
        for name in &asked {
            assert!(
                LaunchEnv::VARIABLES.contains(&name.as_str()),
                "from_vars reads {name}, which VARIABLES does not list"
            );
        }
        for v in LaunchEnv::VARIABLES {
            assert!(asked.iter().any(|a| a == v), "{v} is listed but never read");
        }
        let mut sorted = LaunchEnv::VARIABLES.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            LaunchEnv::VARIABLES.len(),
            "a name is listed twice"
        );
    }

    fn env_of(pairs: &[(&str, &str)]) -> Result<LaunchEnv> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LaunchEnv::from_vars(|k| map.get(k).cloned())
    }

    fn variable(e: Error) -> String {
        match e {
            Error::LaunchEnv { variable, .. } => variable,
            other => panic!("expected LaunchEnv, got {other:?}"),
        }
    }

    #[test]
    fn torchrun_variables() {
        let e = env_of(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29400"),
            // Slurm around torchrun: the torchrun variables win.
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "4"),
        ])
        .unwrap();
        assert_eq!(e.launcher, Launcher::Torch);
        assert_eq!((e.rank, e.world_size, e.local_rank), (3, 8, 1));
        assert_eq!(e.local_world_size, Some(2));
        assert_eq!((e.master_addr.as_str(), e.port), ("10.0.0.1", 29401));
        assert_eq!(e.timeout, DEFAULT_TIMEOUT);
    }

    #[test]
    fn open_mpi_mpich_and_slurm_variables() {
        let ompi = env_of(&[
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "6"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "3"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("MASTER_ADDR", "head"),
        ])
        .unwrap();
        assert_eq!(ompi.launcher, Launcher::OpenMpi, "MPI wins over Slurm");
        assert_eq!((ompi.rank, ompi.world_size, ompi.local_rank), (5, 6, 2));
        assert_eq!(ompi.port, DEFAULT_PORT);

        let mpich = env_of(&[
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
            ("MPI_LOCALRANKID", "1"),
            ("MPI_LOCALNRANKS", "2"),
        ])
        .unwrap();
        assert_eq!(mpich.launcher, Launcher::Mpich);
        // One machine (local size == world size): loopback without MASTER_ADDR.
        assert_eq!(mpich.master_addr, "127.0.0.1");

        let slurm = env_of(&[
            ("SLURM_PROCID", "7"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "3"),
            ("SLURM_NTASKS_PER_NODE", "4(x2)"),
            ("MASTER_ADDR", "node001"),
            ("GPUBIND_RDZV_PORT", "40000"),
            ("MASTER_PORT", "29500"),
            ("GPUBIND_RDZV_TIMEOUT", "2.5"),
        ])
        .unwrap();
        assert_eq!(slurm.launcher, Launcher::Slurm);
        assert_eq!((slurm.rank, slurm.local_rank), (7, 3));
        assert_eq!(slurm.local_world_size, None, "4(x2) is not a plain number");
        assert_eq!(slurm.port, 40000, "GPUBIND_RDZV_PORT wins over MASTER_PORT");
        assert_eq!(slurm.timeout, Duration::from_millis(2500));

        let one_node = env_of(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NNODES", "1"),
        ])
        .unwrap();
        assert_eq!(one_node.master_addr, "127.0.0.1");
    }

    #[test]
    fn bad_launcher_values_are_typed_errors() {
        let base = [("MASTER_ADDR", "h"), ("LOCAL_RANK", "0")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v: Vec<(&str, &str)> = base.to_vec();
            v.extend_from_slice(extra);
            env_of(&v)
        };
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[], "RANK"),
            (&[("RANK", "0")], "WORLD_SIZE"),
            (&[("RANK", "x"), ("WORLD_SIZE", "2")], "RANK"),
            (&[("RANK", "-1"), ("WORLD_SIZE", "2")], "RANK"),
            (&[("RANK", "2"), ("WORLD_SIZE", "2")], "RANK"),
            (&[("RANK", "0"), ("WORLD_SIZE", "0")], "WORLD_SIZE"),
            (&[("RANK", "0"), ("WORLD_SIZE", "two")], "WORLD_SIZE"),
            // Beyond what rank 0 can connect to (and would size its tables by).
            (&[("RANK", "0"), ("WORLD_SIZE", "4294967295")], "WORLD_SIZE"),
            (
                &[
                    ("OMPI_COMM_WORLD_RANK", "0"),
                    ("OMPI_COMM_WORLD_SIZE", "1048577"),
                ],
                "OMPI_COMM_WORLD_SIZE",
            ),
            (
                &[("RANK", "0"), ("WORLD_SIZE", "18446744073709551616")],
                "WORLD_SIZE",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("LOCAL_WORLD_SIZE", "3"),
                ],
                "LOCAL_WORLD_SIZE",
            ),
            (
                &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "65535")],
                "MASTER_PORT",
            ),
            (
                &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "http")],
                "MASTER_PORT",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("GPUBIND_RDZV_PORT", "0"),
                ],
                "GPUBIND_RDZV_PORT",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("GPUBIND_RDZV_TIMEOUT", "-3"),
                ],
                "GPUBIND_RDZV_TIMEOUT",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("GPUBIND_RDZV_TIMEOUT", "inf"),
                ],
                "GPUBIND_RDZV_TIMEOUT",
            ),
        ];
        for (vars, var) in cases {
            let e = with(vars).expect_err(&format!("{vars:?} must fail"));
            let msg = e.to_string();
            assert_eq!(variable(e), *var, "{vars:?}: {msg}");
        }
        // LOCAL_RANK out of LOCAL_WORLD_SIZE; LOCAL_RANK missing for a world of 2.
        let e = env_of(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "2"),
            ("LOCAL_WORLD_SIZE", "2"),
        ])
        .unwrap_err();
        assert_eq!(variable(e), "LOCAL_RANK");
        let e = env_of(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]).unwrap_err();
        assert_eq!(variable(e), "LOCAL_RANK");
        // Two machines possible and no MASTER_ADDR.
        let e = env_of(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")]).unwrap_err();
        assert_eq!(variable(e), "MASTER_ADDR");
        // A world of one needs nothing else.
        let one = env_of(&[("RANK", "0"), ("WORLD_SIZE", "1")]).unwrap();
        assert_eq!((one.local_rank, one.master_addr.as_str()), (0, "127.0.0.1"));
    }
}

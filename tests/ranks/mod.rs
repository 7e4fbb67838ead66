//! What the CPU-only multi-process suites (`rendezvous_process`, `callcheck_process`)
//! share: each re-executes its own test binary as ranks with torchrun-style variables,
//! a role variable naming what the rank does, and one result line to read back.
#![allow(dead_code)] // each suite uses what it needs

use gpubind::collective::LaunchEnv;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A suite's child protocol: the variable that names a child's role, and the prefix of
/// the line a child prints its result on.
pub struct Ranks {
    pub role_var: &'static str,
    pub result_prefix: &'static str,
}

/// The prefix of the line on which a child reports how long its operation took, in
/// milliseconds, measured in the child (so the start-up of the processes, slow on a
/// loaded machine, does not count).
pub const TOOK: &str = "RANK-TOOK-MS ";

/// Prints `took` on a [`TOOK`] line (call it before the result line).
pub fn print_took(took: Duration) {
    println!("{TOOK}{}", took.as_millis());
}

/// The most an operation that may wait `timeouts` of `timeout_s` in a row may take,
/// measured in the rank: each timeout with a generous margin of max(2 s, the timeout).
pub fn within_timeouts(timeout_s: f64, timeouts: u32) -> Duration {
    let t = Duration::from_secs_f64(timeout_s);
    (t + t.max(Duration::from_secs(2))) * timeouts
}

/// How long a child may run before it counts as hung: [`within_timeouts`] plus a
/// generous allowance for starting a process on a loaded machine.
pub fn hang_limit(timeout_s: f64, timeouts: u32) -> Duration {
    within_timeouts(timeout_s, timeouts) + Duration::from_secs(30)
}

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Ranks {
    /// Starts one process as `role` with torchrun-style variables for `rank` of `world`,
    /// rendezvous on `port`, timing out after `timeout_s`.
    pub fn spawn(&self, role: &str, rank: usize, world: usize, port: u16, timeout_s: f64) -> Child {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["child_entry", "--exact", "--nocapture", "--test-threads=1"]);
        // Every variable `LaunchEnv` reads: the parent's own (a CI runner under Slurm,
        // say) must not leak into the ranks.
        for v in LaunchEnv::VARIABLES {
            cmd.env_remove(v);
        }
        cmd.env(self.role_var, role)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("GPUBIND_RDZV_PORT", port.to_string())
            .env("GPUBIND_RDZV_TIMEOUT", timeout_s.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        cmd.spawn().unwrap()
    }

    /// Waits for `child` (killing it and failing past `limit`) and returns its result
    /// line.
    pub fn result(&self, child: Child, limit: Duration) -> String {
        self.result_timed(child, limit).0
    }

    /// [`result`](Self::result), and the time on the child's last [`TOOK`] line
    /// (`Duration::MAX` without one).
    pub fn result_timed(&self, mut child: Child, limit: Duration) -> (String, Duration) {
        let start = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                panic!("a rank hung: still running after {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let took = out
            .lines()
            .filter_map(|l| {
                l.split_once(TOOK)
                    .and_then(|(_, ms)| ms.trim().parse().ok())
            })
            .next_back()
            .map_or(Duration::MAX, Duration::from_millis);
        let line = out
            .lines()
            .find_map(|l| l.split_once(self.result_prefix).map(|(_, r)| r))
            .unwrap_or_else(|| panic!("no result line in the child's output:\n{out}"))
            .to_owned();
        (line, took)
    }

    /// [`result_timed`](Self::result_timed) of every child, in order.
    pub fn results_timed(&self, children: Vec<Child>, limit: Duration) -> Vec<(String, Duration)> {
        children
            .into_iter()
            .map(|c| self.result_timed(c, limit))
            .collect()
    }

    /// [`result`](Self::result) of every child, in order.
    pub fn results(&self, children: Vec<Child>, limit: Duration) -> Vec<String> {
        children
            .into_iter()
            .map(|c| self.result(c, limit))
            .collect()
    }
}

//! [`CompileOptions`] and the NVRTC option list built from it; documented on the type.

use crate::error::{Error, Result};
use std::fmt;
use std::path::{Path, PathBuf};

/// The C++ language standard NVRTC compiles for (`--std=c++NN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CppStandard {
    /// `--std=c++03`.
    Cpp03,
    /// `--std=c++11`.
    Cpp11,
    /// `--std=c++14`.
    Cpp14,
    /// `--std=c++17` (NVRTC's default since CUDA 11).
    Cpp17,
    /// `--std=c++20` (NVRTC 12.0+).
    Cpp20,
}

impl CppStandard {
    fn flag(self) -> &'static str {
        match self {
            CppStandard::Cpp03 => "--std=c++03",
            CppStandard::Cpp11 => "--std=c++11",
            CppStandard::Cpp14 => "--std=c++14",
            CppStandard::Cpp17 => "--std=c++17",
            CppStandard::Cpp20 => "--std=c++20",
        }
    }
}

/// The architecture to compile for, in place of the device's (see
/// [`CompileOptions::arch`]). Numbers are `10 * major + minor` (`90` for `sm_90`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    /// A cubin for the real architecture `sm_XY`. The driver loads it only on a device
    /// of the same major version and at least that minor one
    /// (`CUDA_ERROR_NO_BINARY_FOR_GPU` otherwise).
    Sm(u32),
    /// PTX for the virtual architecture `compute_XY`, JIT-compiled by the driver for the
    /// device at load (any device of at least that compute capability).
    Compute(u32),
}

impl Arch {
    /// The `--gpu-architecture=` option.
    pub(crate) fn flag(self) -> String {
        match self {
            Arch::Sm(a) => format!("--gpu-architecture=sm_{a}"),
            Arch::Compute(a) => format!("--gpu-architecture=compute_{a}"),
        }
    }

    /// What NVRTC produces for it.
    pub(crate) fn output(self) -> super::Output {
        match self {
            Arch::Sm(_) => super::Output::Cubin,
            Arch::Compute(_) => super::Output::Ptx,
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arch::Sm(a) => write!(f, "sm_{a}"),
            Arch::Compute(a) => write!(f, "compute_{a}"),
        }
    }
}

/// Options for NVRTC: [`BoundDevice::compile_and_load_with`](crate::BoundDevice::compile_and_load_with)
/// and [`compile_with`](super::compile_with). Built by chained calls from
/// [`CompileOptions::new`] (the same as `Default`: no macros, the toolkit's include
/// directory, NVRTC's defaults, the device's architecture). See below for
/// what is checked.
///
/// ```no_run
/// # fn f(gpu: &gpubind::BoundDevice<'_>, src: &str) -> gpubind::Result<()> {
/// use gpubind::{CompileOptions, CppStandard};
/// let opts = CompileOptions::new()
///     .define("TILE", 32)
///     .fast_math(true)
///     .std(CppStandard::Cpp17)
///     .line_info(true);
/// let module = gpu.compile_and_load_with(src, "tiled.cu", &opts)?;
/// # Ok(()) }
/// ```
///
/// Every setting is checked when the options are used, before NVRTC runs: a macro name
/// that is not a C identifier (an `=`, a space, a newline), a value with a newline, an
/// include directory that does not exist, an extra flag that does not start with `-` or
/// that names the architecture (use [`CompileOptions::arch`]) is
/// [`Error::InvalidArgument`] naming it. A flag NVRTC itself refuses is
/// [`Error::Compile`] with status `NVRTC_ERROR_INVALID_OPTION`, naming the flag.
///
/// # CUDA headers and math macros
///
/// Unless [`toolkit_include(false)`](CompileOptions::toolkit_include) is set, the CUDA
/// toolkit's include directory is passed to NVRTC, so `<cuda_fp16.h>`, `<cuda_bf16.h>`,
/// `<math_constants.h>` and the other toolkit headers can be included. It is the first
/// directory holding `cuda_fp16.h` among, in order:
///
/// 1. `include` next to the NVRTC library in use (`<dir of libnvrtc.so>/../include`, and
///    `<dir>/../../include` for the `targets/<arch>/lib` layout), and the
///    `cuda_runtime/include` of the pip wheels' layout (`nvidia/cuda_nvrtc/lib` beside
///    `nvidia/cuda_runtime/include`);
/// 2. `$CUDA_HOME/include`, `$CUDA_PATH/include`;
/// 3. `/usr/local/cuda/include`.
///
/// A kernel that includes a header NVRTC cannot open, when no such directory was found,
/// gets an [`Error::Compile`] whose log lists where gpubind looked, after NVRTC's own
/// log. [`cuda_include_dir`] reports the choice.
///
/// NVRTC has no `<math.h>`, so the C macros `INFINITY` and `NAN` are undefined in NVRTC
/// code; gpubind defines them for a source that uses them without `#define`-ing them
/// itself (as `float` constants, usable in `__device__` initialisers from C++11 on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileOptions {
    defines: Vec<(String, String)>,
    include_paths: Vec<PathBuf>,
    fast_math: bool,
    std: Option<CppStandard>,
    arch: Option<Arch>,
    line_info: bool,
    debug: bool,
    toolkit_include: bool,
    flags: Vec<String>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            defines: Vec::new(),
            include_paths: Vec::new(),
            fast_math: false,
            std: None,
            arch: None,
            line_info: false,
            debug: false,
            toolkit_include: true,
            flags: Vec::new(),
        }
    }
}

impl CompileOptions {
    /// The defaults; see the type's docs.
    pub fn new() -> Self {
        Self::default()
    }

    /// Defines the macro `name` as `value` (`-Dname=value`; `""` defines it empty).
    /// `name` must be a C identifier and `value` one line.
    pub fn define(mut self, name: impl Into<String>, value: impl fmt::Display) -> Self {
        self.defines.push((name.into(), value.to_string()));
        self
    }

    /// Adds a directory to search for `#include`s (`--include-path=`), after the ones
    /// added before and before the toolkit's. It must exist.
    pub fn include_path(mut self, dir: impl Into<PathBuf>) -> Self {
        self.include_paths.push(dir.into());
        self
    }

    /// Fast, less accurate math (`--use_fast_math`: flushes denormals to zero, uses the
    /// approximate division, square root and intrinsics such as `__expf`).
    pub fn fast_math(mut self, on: bool) -> Self {
        self.fast_math = on;
        self
    }

    /// The C++ standard (`--std=c++NN`); NVRTC's default when not set.
    pub fn std(mut self, std: CppStandard) -> Self {
        self.std = Some(std);
        self
    }

    /// Compiles for `arch` instead of choosing from the device (the default: a cubin for
    /// the device's `sm_XY`, or PTX for the newest architecture an older NVRTC knows).
    /// For [`compile_with`](super::compile_with) it is the only way to name one.
    pub fn arch(mut self, arch: Arch) -> Self {
        self.arch = Some(arch);
        self
    }

    /// Line information for profilers and `compute-sanitizer` (`--generate-line-info`).
    pub fn line_info(mut self, on: bool) -> Self {
        self.line_info = on;
        self
    }

    /// Device debug information, optimisations off (`--device-debug`, `-G`).
    pub fn debug(mut self, on: bool) -> Self {
        self.debug = on;
        self
    }

    /// Whether the CUDA toolkit's include directory is searched (default: yes, when one
    /// is found; see [`CompileOptions`]).
    pub fn toolkit_include(mut self, on: bool) -> Self {
        self.toolkit_include = on;
        self
    }

    /// Passes `flag` to NVRTC as given (e.g. `--maxrregcount=64`,
    /// `--extra-device-vectorization`). It must start with `-` and must not name the
    /// architecture.
    pub fn flag(mut self, flag: impl Into<String>) -> Self {
        self.flags.push(flag.into());
        self
    }

    /// The architecture override, if set.
    pub fn target_arch(&self) -> Option<Arch> {
        self.arch
    }

    /// Whether the toolkit's include directory is searched.
    pub fn uses_toolkit_include(&self) -> bool {
        self.toolkit_include
    }

    /// The NVRTC options these settings translate to, checked (see
    /// [`CompileOptions`]): the macros, include directories, the standard, fast math,
    /// line and debug information, the architecture override, then the extra flags. The
    /// toolkit's include directory and the device's architecture, which the compile
    /// adds, are not among them.
    ///
    /// ```
    /// use gpubind::{Arch, CompileOptions};
    /// let opts = CompileOptions::new().define("N", 4).fast_math(true).arch(Arch::Sm(90));
    /// assert_eq!(
    ///     opts.nvrtc_options()?,
    ///     ["-DN=4", "--use_fast_math", "--gpu-architecture=sm_90"]
    /// );
    /// let bad = CompileOptions::new().define("N=4", 1);
    /// assert!(matches!(bad.nvrtc_options(), Err(gpubind::Error::InvalidArgument(_))));
    /// # Ok::<(), gpubind::Error>(())
    /// ```
    pub fn nvrtc_options(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for (name, value) in &self.defines {
            check_define(name, value)?;
            out.push(format!("-D{name}={value}"));
        }
        for dir in &self.include_paths {
            out.push(format!("--include-path={}", checked_dir(dir)?));
        }
        if let Some(std) = self.std {
            out.push(std.flag().to_owned());
        }
        if self.fast_math {
            out.push("--use_fast_math".to_owned());
        }
        if self.line_info {
            out.push("--generate-line-info".to_owned());
        }
        if self.debug {
            out.push("--device-debug".to_owned());
        }
        if let Some(arch) = self.arch {
            check_arch(arch)?;
            out.push(arch.flag());
        }
        for flag in &self.flags {
            check_flag(flag)?;
            out.push(flag.clone());
        }
        Ok(out)
    }

    /// The extra flags as given (to name a refused one).
    pub(crate) fn extra_flags(&self) -> &[String] {
        &self.flags
    }
}

fn invalid(msg: String) -> Error {
    Error::InvalidArgument(format!("CompileOptions: {msg}"))
}

/// A macro name must be a C identifier; its value one line without NUL.
fn check_define(name: &str, value: &str) -> Result<()> {
    let mut chars = name.chars();
    let ident = chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric());
    if !ident {
        return Err(invalid(format!(
            "macro name {name:?} is not a C identifier (letters, digits and `_`, not \
             starting with a digit; the value goes in `define`'s second argument)"
        )));
    }
    if value.contains(['\n', '\r', '\0']) {
        return Err(invalid(format!(
            "the value of macro `{name}`, {value:?}, contains a line break or NUL"
        )));
    }
    Ok(())
}

/// An include directory must exist and be passable to NVRTC (UTF-8, no NUL).
fn checked_dir(dir: &Path) -> Result<&str> {
    if !dir.is_dir() {
        return Err(invalid(format!(
            "include directory {} does not exist (or is not a directory)",
            dir.display()
        )));
    }
    dir.to_str().filter(|s| !s.contains('\0')).ok_or_else(|| {
        invalid(format!(
            "include directory {} is not valid UTF-8",
            dir.display()
        ))
    })
}

/// An architecture number looks like one (`10 * major + minor`, sm_30 to sm_999).
fn check_arch(arch: Arch) -> Result<()> {
    let (Arch::Sm(n) | Arch::Compute(n)) = arch;
    if !(30..1000).contains(&n) {
        return Err(invalid(format!(
            "architecture {arch} is not 10 * major + minor of a compute capability (e.g. 90 \
             for sm_90)"
        )));
    }
    Ok(())
}

/// An extra flag is an option (starts with `-`), one token, and leaves the architecture
/// to [`CompileOptions::arch`].
fn check_flag(flag: &str) -> Result<()> {
    if !flag.starts_with('-') || flag.contains(['\n', '\r', '\0']) {
        return Err(invalid(format!(
            "extra flag {flag:?} is not an option (one line starting with `-`)"
        )));
    }
    let name = flag.split('=').next().unwrap_or(flag);
    if matches!(name, "--gpu-architecture" | "-arch") || flag.starts_with("-arch=") {
        return Err(invalid(format!(
            "extra flag {flag:?} names the architecture: use CompileOptions::arch"
        )));
    }
    Ok(())
}

/// The CUDA toolkit's include directory gpubind passes to NVRTC (see
/// [`CompileOptions`] for the search order), or `None` if none of the candidates holds
/// `cuda_fp16.h`.
pub fn cuda_include_dir() -> Option<PathBuf> {
    include_candidates()
        .into_iter()
        .find(|d| d.join("cuda_fp16.h").is_file())
}

/// The directories [`cuda_include_dir`] looks at, in order.
pub(crate) fn include_candidates() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(lib_dir) = nvrtc_dir() {
        dirs.push(lib_dir.join("../include"));
        dirs.push(lib_dir.join("../../include"));
        dirs.push(lib_dir.join("../../cuda_runtime/include"));
    }
    for root in crate::config::cuda_toolkit_roots(&crate::config::env) {
        dirs.push(root.join("include"));
    }
    dirs.push(PathBuf::from("/usr/local/cuda/include"));
    dirs
}

/// The directory of the NVRTC library gpubind loaded: the override's directory when
/// `GPUBIND_NVRTC_PATH` is a path, else the directory of the mapped `libnvrtc.so.<major>`
/// file (`/proc/self/maps`).
fn nvrtc_dir() -> Option<PathBuf> {
    let info = crate::driver::libraries::nvrtc().ok()?.info.clone();
    let named = Path::new(&info.name);
    if named.is_absolute() {
        return named.parent().map(Path::to_path_buf);
    }
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    mapped_nvrtc_dir(&maps, info.version.0)
}

/// The directory of the first `libnvrtc.so.<major>…` mapped in `maps` (the format of
/// `/proc/self/maps`), else of any `libnvrtc.so…` (not the builtins library).
pub(crate) fn mapped_nvrtc_dir(maps: &str, major: u32) -> Option<PathBuf> {
    let paths: Vec<&Path> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.starts_with('/'))
        .map(Path::new)
        .collect();
    let file = |p: &&Path| {
        p.file_name()
            .and_then(|f| f.to_str())
            .unwrap_or("")
            .to_owned()
    };
    let versioned = format!("libnvrtc.so.{major}");
    paths
        .iter()
        .find(|p| file(p).starts_with(&versioned))
        .or_else(|| paths.iter().find(|p| file(p).starts_with("libnvrtc.so")))
        .and_then(|p| p.parent())
        .map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_name_the_nvrtc_in_use() {
        let maps = "\
7f00-7f01 r--p 00000000 08:01 1 /opt/cuda-13/lib64/libnvrtc.so.13.0.48
7f01-7f02 r--p 00000000 08:01 2 /usr/local/cuda-12.4/targets/x86_64-linux/lib/libnvrtc.so.12.4.127
7f02-7f03 r--p 00000000 08:01 3 /usr/local/cuda-12.4/lib64/libnvrtc-builtins.so.12.4
7f03-7f04 rw-p 00000000 00:00 0 [heap]";
        assert_eq!(
            mapped_nvrtc_dir(maps, 12),
            Some(PathBuf::from(
                "/usr/local/cuda-12.4/targets/x86_64-linux/lib"
            ))
        );
        assert_eq!(
            mapped_nvrtc_dir(maps, 13),
            Some(PathBuf::from("/opt/cuda-13/lib64"))
        );
        assert_eq!(
            mapped_nvrtc_dir(maps, 11),
            Some(PathBuf::from("/opt/cuda-13/lib64"))
        );
        assert_eq!(mapped_nvrtc_dir("7f-8f r--p 0 0:0 0 [vdso]", 12), None);
    }
}

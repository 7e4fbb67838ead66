//! Which CUDA libraries load on this machine: a utility below the driver layer, so that
//! errors can ask whether `libcuda` is there before asking it for an error's name.

use cudarc::driver::sys;

/// Whether one of the usual names of a CUDA library (`cuda`, `nvrtc`, `cublas`) loads.
///
/// gpubind's own check rather than cudarc's `is_culib_present`, which exists only under
/// cudarc's `dynamic-loading` (a crate in the tree enabling `dynamic-linking`, as
/// candle-core does, removes it). The names are ones cudarc's loader also tries, for the
/// major version of its bindings, so a library found here is one cudarc's `dynamic-loading`
/// finds too; under `dynamic-linking` the library is already loaded under its soname
/// (`libcuda.so.1`, `libnvrtc.so.13`), which is in the list.
pub(crate) fn loadable(stems: &[&str]) -> bool {
    library_names(stems)
        .iter()
        // SAFETY: loading a CUDA library runs its ELF initialisers only (no GPU work);
        // the handle is closed again at once (the library stays mapped while loaded
        // elsewhere, as cudarc's own check does it).
        .any(|name| unsafe { libloading::Library::new(name) }.is_ok())
}

/// The file names tried for each stem: `libcuda.so`, `libcuda.so.1`, `libnvrtc.so.13`
/// (the bindings' major version), `libnvrtc.so.12` (a 12.x toolkit beside an old
/// driver), ... (Windows: `nvcuda.dll`, `nvrtc64_130_0.dll`, `cublas64_12.dll`, ...).
/// Every name is one cudarc's `dynamic-loading` loader tries as well.
fn library_names(stems: &[&str]) -> Vec<String> {
    use std::env::consts::{DLL_PREFIX, DLL_SUFFIX};
    let major = sys::CUDA_VERSION / 1000;
    let mut names = Vec::new();
    for stem in stems {
        names.push(format!("{DLL_PREFIX}{stem}{DLL_SUFFIX}"));
        if cfg!(windows) {
            for v in [major.to_string(), "12".into()] {
                names.push(format!("{DLL_PREFIX}{stem}64_{v}{DLL_SUFFIX}"));
                names.push(format!("{DLL_PREFIX}{stem}64_{v}0_0{DLL_SUFFIX}"));
            }
        } else {
            for v in [major.to_string(), "12".into(), "11".into(), "1".into()] {
                names.push(format!("{DLL_PREFIX}{stem}{DLL_SUFFIX}.{v}"));
            }
        }
    }
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_names_cover_the_sonames() {
        let names = library_names(&["cuda", "nvrtc"]);
        if cfg!(target_os = "linux") {
            let major = sys::CUDA_VERSION / 1000;
            for want in [
                "libcuda.so".to_owned(),
                "libcuda.so.1".to_owned(),
                format!("libnvrtc.so.{major}"),
                "libnvrtc.so.12".to_owned(),
            ] {
                assert!(names.contains(&want), "{want} not in {names:?}");
            }
        }
        // The first name of each stem is the plain one.
        assert!(names[0].contains("cuda") && !names[0].contains("nvrtc"));
    }
}

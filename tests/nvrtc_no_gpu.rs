//! NVRTC without a GPU: which library gpubind loads, and compiling with it. Where no NVRTC
//! can be loaded, the same calls must fail with the typed error (never a panic).
//!
//! To exercise the loading on a machine with two toolkits (or the pip wheels
//! `nvidia-cuda-nvrtc-cu12` and `nvidia-cuda-nvrtc`): put both library directories on
//! `LD_LIBRARY_PATH`, run this test, then again with `GPUBIND_NVRTC_PATH` naming the older
//! `libnvrtc.so.12`.

use gpubind::{Output, compile, nvrtc_available, nvrtc_info, nvrtc_supported_archs};

const SRC: &str = r#"
struct P { float a; unsigned n; };
extern "C" __global__ void k(P p, float* y) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n) y[i] *= p.a;
}"#;

#[test]
fn nvrtc_is_chosen_and_compiles_or_is_a_typed_error() {
    if !nvrtc_available() {
        assert_eq!(nvrtc_info().unwrap_err(), gpubind::Error::NoNvrtc);
        assert_eq!(
            compile(SRC, "k.cu", &[], Output::Ptx).unwrap_err(),
            gpubind::Error::NoNvrtc
        );
        println!("no NVRTC here: checked the typed error only");
        return;
    }
    let info = nvrtc_info().unwrap();
    println!("NVRTC: {info:?}");
    let (major, _) = info.version;
    assert!(major >= 11, "{info:?}");
    // The library reports the version its name promises (a versioned soname).
    if let Some(v) = info
        .name
        .rsplit(".so.")
        .next()
        .filter(|_| info.name.contains(".so."))
        && let Some(m) = v.split('.').next().and_then(|m| m.parse::<u32>().ok())
    {
        assert_eq!(m, major, "{info:?}");
    }
    if let Ok(want) = std::env::var("GPUBIND_NVRTC_PATH")
        && !want.is_empty()
    {
        assert_eq!(info.name, want, "the override was not taken");
    }
    // Never newer than the driver, where there is one.
    if let Some(d) = info.driver_major
        && std::env::var("GPUBIND_NVRTC_PATH").map_or(true, |p| p.is_empty())
    {
        assert!(major <= d, "{info:?}");
    }
    let archs = nvrtc_supported_archs().unwrap();
    println!("supported: {archs:?}");
    let newest = archs
        .as_ref()
        .and_then(|a| a.iter().copied().max())
        .unwrap_or(75);
    // PTX for a virtual architecture, and a cubin for a real one.
    let ptx = compile(
        SRC,
        "k.cu",
        &[format!("--gpu-architecture=compute_{newest}")],
        Output::Ptx,
    )
    .unwrap();
    let text = String::from_utf8(ptx).unwrap();
    assert!(text.contains(".entry k("), "{text}");
    assert!(text.contains(&format!(".target sm_{newest}")), "{text}");
    let cubin = compile(
        SRC,
        "k.cu",
        &[format!("--gpu-architecture=sm_{newest}")],
        Output::Cubin,
    )
    .unwrap();
    assert_eq!(&cubin[..4], b"\x7fELF");
    // A compile error carries NVRTC's status name and log.
    match compile("this is not C++", "bad.cu", &[], Output::Ptx) {
        Err(gpubind::Error::Compile {
            program,
            status,
            log,
        }) => {
            assert_eq!(program, "bad.cu");
            assert_eq!(status, "NVRTC_ERROR_COMPILATION");
            assert!(log.contains("bad.cu"), "{log}");
        }
        other => panic!("not a compile error: {other:?}"),
    }
}

//! [`GivenBack`]: an error that hands a consumed input back to the caller.

use super::Error;
use std::fmt;

/// A call that takes ownership of its input failed and gives the input back unchanged,
/// with the reason: the caller keeps its data, as with
/// [`std::sync::mpsc::SendError`]. Returned boxed (`Box<GivenBack<T>>`, so that a
/// `Result` stays small) by [`BoundDevice::register_vec`](crate::BoundDevice::register_vec),
/// [`RegisteredHost::into_vec`](crate::RegisteredHost::into_vec),
/// [`DeviceSlice::into_raw`](crate::DeviceSlice::into_raw),
/// [`BoundDevice::adopt_cudarc_slice`](crate::BoundDevice::adopt_cudarc_slice) and
/// `dlpack::export` / `dlpack::export_legacy`, and inside `ipc::GiveBackError::StillHeld`
/// by the `give_back` of an IPC import.
///
/// `?` converts it into an [`Error`] (dropping the input) in a function returning
/// [`crate::Result`]; match on it to keep the input:
///
/// ```no_run
/// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
/// let data = vec![1.0f32; 1 << 20];
/// let data = match gpu.register_vec(data, Default::default()) {
///     Ok(reg) => reg.into_vec()?.unwrap_or_default(),
///     Err(failed) => {
///         eprintln!("not page-locked ({}), using pageable memory", failed.error);
///         failed.input
///     }
/// };
/// # let _ = data; Ok(()) }
/// ```
pub struct GivenBack<T> {
    /// The input, as it was passed.
    pub input: T,
    /// Why the call failed.
    pub error: Error,
}

impl<T> GivenBack<T> {
    /// `input` and `error`, boxed, as the failing calls return them.
    pub(crate) fn boxed(input: T, error: Error) -> Box<GivenBack<T>> {
        Box::new(GivenBack { input, error })
    }

    /// The input and the error.
    pub fn into_parts(self) -> (T, Error) {
        (self.input, self.error)
    }
}

impl<T> fmt::Debug for GivenBack<T> {
    /// The error and the input's type (not its contents, which may be large).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GivenBack")
            .field("input", &std::any::type_name::<T>())
            .field("error", &self.error)
            .finish()
    }
}

impl<T> fmt::Display for GivenBack<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (the input is given back)", self.error)
    }
}

impl<T> std::error::Error for GivenBack<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<T> From<Box<GivenBack<T>>> for Error {
    /// The error; the input is dropped.
    fn from(e: Box<GivenBack<T>>) -> Error {
        e.error
    }
}

impl<T> From<GivenBack<T>> for Error {
    /// The error; the input is dropped.
    fn from(e: GivenBack<T>) -> Error {
        e.error
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_input_and_converts_to_its_error() {
        let failed = GivenBack::boxed(vec![1u8, 2, 3], Error::InvalidArgument("bad".into()));
        assert_eq!(
            failed.to_string(),
            "invalid argument: bad (the input is given back)"
        );
        assert!(format!("{failed:?}").contains("alloc::vec::Vec<u8>"));
        let (input, error) = failed.into_parts();
        assert_eq!(input, [1, 2, 3]);
        assert_eq!(error, Error::InvalidArgument("bad".into()));
        let e: Error = GivenBack::boxed((), Error::InvalidArgument("x".into())).into();
        assert_eq!(e, Error::InvalidArgument("x".into()));
    }
}

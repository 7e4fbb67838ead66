//! The NCCL backend in a build without gpubind's `nccl` feature: the crate-internal API
//! of `nccl.rs`, with no NCCL code, types or library loading behind it.
//!
//! [`Backend::Nccl`](crate::collective::Backend::Nccl) stays in the API (a backend is often chosen at
//! run time, from a flag), and every way into it returns [`Error::FeatureDisabled`]
//! before anything is created. The communicator and id types are uninhabited, so the
//! NCCL arms of the collectives compile and can never run.

use crate::collective::api::call::Call;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::cell::Cell;
use std::marker::PhantomData;

fn disabled() -> Error {
    Error::FeatureDisabled {
        feature: "nccl",
        what: "the NCCL backend of the collectives (Backend::Nccl)",
    }
}

/// Always [`Error::FeatureDisabled`].
pub(crate) fn api() -> Result<()> {
    Err(disabled())
}

/// Always `false`: this build of gpubind has no NCCL backend (the `nccl` feature is off).
pub fn nccl_available() -> bool {
    false
}

/// Always [`Error::FeatureDisabled`]: this build of gpubind has no NCCL backend (the
/// `nccl` feature is off).
pub fn nccl_version() -> Result<(u32, u32, u32)> {
    Err(disabled())
}

/// Never made (uninhabited).
#[derive(Clone, Copy)]
pub(crate) enum UniqueId {}

/// Never made (uninhabited). `Send` and not `Sync`, like the real one, so
/// `Communicator` and `RankComm` have the same auto traits in every build.
pub(crate) struct NcclComm {
    never: Never,
    _not_sync: PhantomData<Cell<()>>,
}

enum Never {}

impl NcclComm {
    pub(crate) fn init_all(_ordinals: &[usize]) -> Result<Vec<NcclComm>> {
        Err(disabled())
    }

    pub(crate) fn init_rank_process(
        _device: &std::sync::Arc<crate::device::Device>,
        _nranks: usize,
        _id: &[u8; 128],
        _rank: usize,
        _timeout: std::time::Duration,
    ) -> Result<NcclComm> {
        Err(disabled())
    }

    /// Never called: there is no value to call it on.
    pub(crate) fn note_issued(
        &mut self,
        _stream: &crate::stream::BoundStream<'_>,
        _ev: crate::stream::Event,
        _op: &'static str,
    ) -> Result<()> {
        match self.never {}
    }

    /// Never called: there is no value to call it on.
    pub(crate) fn spare_event(
        &self,
        _stream: &crate::stream::BoundStream<'_>,
    ) -> Result<crate::stream::Event> {
        match self.never {}
    }

    /// Never called: there is no value to call it on.
    pub(crate) fn give_back(&self, _ev: crate::stream::Event) {
        match self.never {}
    }

    /// Never called: there is no value to call it on.
    #[allow(dead_code)]
    pub(crate) fn note_in_flight(&self, _event: crate::stream::Event, _op: &'static str) {
        match self.never {}
    }

    /// Never called: there is no value to call it on.
    pub(crate) fn verdict(&self) -> Option<Error> {
        match self.never {}
    }

    /// Never called: there is no value to call it on.
    pub(crate) fn check(&self) -> Result<()> {
        match self.never {}
    }

    /// Never called: there is no value to call it on.
    pub(crate) fn wait(&mut self, _stream: &crate::stream::BoundStream<'_>) -> Result<()> {
        match self.never {}
    }

    /// Never called: there is no value to call it on.
    pub(crate) fn order(&self) -> &crate::access::AccessTracker {
        match self.never {}
    }

    /// Nothing to abort: there is no value to call it on.
    pub(crate) fn abort_bounded(&self, _device: Option<&std::sync::Arc<crate::device::Device>>) {}

    /// # Safety
    ///
    /// None needed: there is no value to call it on.
    pub(crate) unsafe fn issue(&self, _call: &Call, _stream: sys::CUstream) -> Result<()> {
        match self.never {}
    }
}

/// Never called: there is no id.
pub(crate) fn id_bytes(id: &UniqueId) -> [u8; 128] {
    match *id {}
}

/// Always [`Error::FeatureDisabled`].
pub(crate) fn unique_id_bytes() -> Result<[u8; 128]> {
    Err(disabled())
}

/// Always [`Error::FeatureDisabled`].
pub(crate) fn unique_id() -> Result<UniqueId> {
    Err(disabled())
}

/// Always [`Error::FeatureDisabled`] (only reached through a `NcclComm`, which cannot
/// exist); `f` is not run.
pub(crate) fn group(_f: impl FnOnce() -> Result<()>) -> Result<()> {
    Err(disabled())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_is_a_typed_error_without_the_feature() {
        assert!(!nccl_available());
        let e = nccl_version().unwrap_err();
        assert!(
            matches!(
                e,
                Error::FeatureDisabled {
                    feature: "nccl",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("`nccl` feature"), "{e}");
        assert!(matches!(api(), Err(Error::FeatureDisabled { .. })));
        assert!(matches!(unique_id(), Err(Error::FeatureDisabled { .. })));
        assert!(matches!(
            unique_id_bytes(),
            Err(Error::FeatureDisabled { .. })
        ));
        assert!(matches!(
            NcclComm::init_all(&[0]),
            Err(Error::FeatureDisabled { .. })
        ));
    }
}

//! Which probe goes where: each entry point of the driver table becomes one entry and one return
//! probe on the shared BPF programs, with a cookie carrying its API id and argument shape.

use gpuprof_ebpf::types::{gp_cookie, gp_shape};
use gpuprof_model::driver_api::{ArgLayout, ContextSwitch, CONTEXT_SWITCHES, DRIVER_APIS};

/// The BPF shape that reads an argument layout.
fn shape_of(layout: ArgLayout) -> (gp_shape, u8) {
    match layout {
        ArgLayout::OutPtrSize => (gp_shape::GP_SHAPE_OUT_PTR_SIZE, 0),
        ArgLayout::OutPtrSize32 => (gp_shape::GP_SHAPE_OUT_PTR_SIZE32, 0),
        ArgLayout::OutPtr32Size32 => (gp_shape::GP_SHAPE_OUT_PTR32_SIZE32, 0),
        ArgLayout::OutPitch => (gp_shape::GP_SHAPE_OUT_PITCH, 0),
        ArgLayout::OutPitch32 => (gp_shape::GP_SHAPE_OUT_PITCH32, 0),
        ArgLayout::Ptr => (gp_shape::GP_SHAPE_PTR, 0),
        ArgLayout::Ptr32 => (gp_shape::GP_SHAPE_PTR32, 0),
        ArgLayout::PtrSize => (gp_shape::GP_SHAPE_PTR_SIZE, 0),
        ArgLayout::VmmCreate => (gp_shape::GP_SHAPE_VMM_CREATE, 0),
        ArgLayout::VmmMap => (gp_shape::GP_SHAPE_VMM_MAP, 0),
        ArgLayout::IpcGet => (gp_shape::GP_SHAPE_IPC_GET, 0),
        ArgLayout::IpcOpen => (gp_shape::GP_SHAPE_IPC_OPEN, 0),
        ArgLayout::ShareableExport => (gp_shape::GP_SHAPE_SHAREABLE_EXPORT, 0),
        ArgLayout::ShareableImport => (gp_shape::GP_SHAPE_SHAREABLE_IMPORT, 0),
        ArgLayout::PoolExport => (gp_shape::GP_SHAPE_POOL_EXPORT, 0),
        ArgLayout::PoolImport => (gp_shape::GP_SHAPE_POOL_IMPORT, 0),
        ArgLayout::CtxRetain => (gp_shape::GP_SHAPE_CTX_RETAIN, 0),
        ArgLayout::CtxCreate { device_arg } => (gp_shape::GP_SHAPE_CTX_CREATE, device_arg),
        ArgLayout::Device => (gp_shape::GP_SHAPE_DEVICE, 0),
        ArgLayout::MemInfo => (gp_shape::GP_SHAPE_MEM_INFO, 0),
        ArgLayout::MemInfo32 => (gp_shape::GP_SHAPE_MEM_INFO32, 0),
    }
}

/// One entry point to probe in a library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DriverProbe {
    pub symbol: &'static str,
    pub cookie: u64,
}

/// The cookie of table entry `api`, laid out as `struct gp_cookie`.
pub(crate) fn cookie(api: u16, layout: ArgLayout) -> u64 {
    let (shape, param) = shape_of(layout);
    let cookie = gp_cookie { api, shape: shape.0 as u8, param, reserved: 0 };
    // SAFETY: gp_cookie is a plain #[repr(C)] struct of 8 bytes with no padding.
    unsafe { std::mem::transmute::<gp_cookie, u64>(cookie) }
}

/// Every driver probe, in table order, then the context switches (ids after the table's; they
/// make no record, only the thread's current context).
pub(crate) fn driver_probes() -> Vec<DriverProbe> {
    let recorded = DRIVER_APIS
        .iter()
        .enumerate()
        .map(|(id, api)| DriverProbe { symbol: api.name, cookie: cookie(id as u16, api.args) });
    let switches = CONTEXT_SWITCHES.iter().enumerate().map(|(i, (symbol, switch))| {
        let param = match switch {
            ContextSwitch::Set => 0,
            ContextSwitch::Pop => 1,
        };
        let cookie = gp_cookie {
            api: (DRIVER_APIS.len() + i) as u16,
            shape: gp_shape::GP_SHAPE_CTX_CURRENT.0 as u8,
            param,
            reserved: 0,
        };
        // SAFETY: as in `cookie`.
        DriverProbe { symbol, cookie: unsafe { std::mem::transmute::<gp_cookie, u64>(cookie) } }
    });
    recorded.chain(switches).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_packs_api_shape_and_param_little_endian() {
        let value = cookie(0x0102, ArgLayout::CtxCreate { device_arg: 4 });
        assert_eq!(value & 0xffff, 0x0102);
        assert_eq!((value >> 16) & 0xff, u64::from(gp_shape::GP_SHAPE_CTX_CREATE.0));
        assert_eq!((value >> 24) & 0xff, 4);
        assert_eq!(value >> 32, 0);
    }

    #[test]
    fn one_probe_per_table_entry_then_the_context_switches() {
        let probes = driver_probes();
        assert_eq!(probes.len(), DRIVER_APIS.len() + CONTEXT_SWITCHES.len());
        assert_eq!(probes[0].symbol, "cuMemAlloc_v2");
        let pop = &probes[DRIVER_APIS.len() + 3];
        assert_eq!(pop.symbol, "cuCtxPopCurrent_v2");
        assert_eq!(pop.cookie & 0xffff, (DRIVER_APIS.len() + 3) as u64);
        assert_eq!((pop.cookie >> 16) & 0xff, u64::from(gp_shape::GP_SHAPE_CTX_CURRENT.0));
        assert_eq!((pop.cookie >> 24) & 0xff, 1);
    }
}

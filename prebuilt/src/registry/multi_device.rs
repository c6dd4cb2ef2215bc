//! Several GPUs in one process, on a CPU: a fake host whose devices differ in compute
//! capability, recording which device every module is loaded into and every launch runs on.

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use super::load_order::{artifact, Setup};
use super::*;
use crate::device::DriverVersion;
use crate::driver::{Context, LaunchConfig};
use crate::key::sha256_hex;

/// A host with one device per entry of `capabilities` (ordinal → compute capability) behind a
/// 13.0 driver. Keeps every load as (ordinal, image) and every launch as the ordinal of the
/// module that ran it.
struct FakeHost {
    capabilities: BTreeMap<u32, (u32, u32)>,
    loads: Mutex<Vec<(u32, Vec<u8>)>>,
    launches: Arc<Mutex<Vec<u32>>>,
    /// Loads on this device wait (up to 5 s) until another device has loaded something.
    waits_for_another: Option<u32>,
}

impl FakeHost {
    fn new(capabilities: &[(u32, (u32, u32))]) -> Arc<FakeHost> {
        Arc::new(FakeHost {
            capabilities: capabilities.iter().copied().collect(),
            loads: Mutex::new(Vec::new()),
            launches: Arc::new(Mutex::new(Vec::new())),
            waits_for_another: None,
        })
    }

    fn loads(&self) -> Vec<(u32, Vec<u8>)> {
        self.loads.lock().unwrap().clone()
    }

    fn loads_on(&self, ordinal: u32) -> usize {
        self.loads().iter().filter(|(on, _)| *on == ordinal).count()
    }
}

struct FakeModule {
    ordinal: u32,
    launches: Arc<Mutex<Vec<u32>>>,
}

impl LoadedModule for FakeModule {
    fn context(&self) -> Option<&Arc<Context>> {
        None
    }

    unsafe fn launch(&self, _: usize, _: &LaunchConfig, _: &[&[u8]]) -> Result<(), DriverError> {
        self.launches.lock().unwrap().push(self.ordinal);
        Ok(())
    }
}

impl Device for FakeHost {
    fn facts(&self, ordinal: u32) -> Result<DeviceFacts, DriverError> {
        let count = self.capabilities.len() as u32;
        let no_device = DriverError::NoDevice { ordinal, count };
        let capability = self.capabilities.get(&ordinal).copied().ok_or(no_device)?;
        Ok(DeviceFacts {
            capability,
            driver: DriverVersion {
                major: 13,
                minor: 0,
            },
        })
    }

    fn load(
        &self,
        ordinal: u32,
        image: &[u8],
        _symbols: &[&str],
    ) -> Result<Arc<dyn LoadedModule>, ModuleFailure> {
        if self.waits_for_another == Some(ordinal) {
            let began = Instant::now();
            while !self.loads().iter().any(|(on, _)| *on != ordinal)
                && began.elapsed() < Duration::from_secs(5)
            {
                std::thread::sleep(Duration::from_millis(1));
            }
        } else {
            // A load that takes a while, so that threads asking at once overlap.
            std::thread::sleep(Duration::from_millis(20));
        }
        self.loads.lock().unwrap().push((ordinal, image.to_vec()));
        Ok(Arc::new(FakeModule {
            ordinal,
            launches: Arc::clone(&self.launches),
        }))
    }
}

const BOTH: [&str; 2] = ["cu130/sm_90a", "cu130/sm_100a"];

fn registry(setup: &Setup, host: Arc<FakeHost>, jit: JitPolicy) -> Registry {
    let options = setup.options(jit, DownloadPolicy::Allowed);
    Registry::open_on(setup.bundle.path(), options, host, None).unwrap()
}

fn launch(kernel: &Kernel) {
    let args = [KernelArg::Ptr(0), KernelArg::I32(1)];
    // SAFETY: the fake device runs nothing; the arguments only have to match the sizes.
    unsafe { kernel.launch("scale", [1; 3], [1; 3], 0, &args) }.unwrap();
}

#[test]
fn each_device_gets_the_variant_its_own_capability_selects() {
    let setup = Setup::new(&BOTH, &BOTH);
    let host = FakeHost::new(&[(0, (9, 0)), (1, (10, 0))]);
    let registry = registry(&setup, host.clone(), JitPolicy::Disabled);
    let variants = |ordinal| match &registry.status_on(ordinal)["scale"] {
        Status::Available { variant, .. } => variant.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (variants(0), variants(1)),
        ("cu130/sm_90a".to_owned(), "cu130/sm_100a".to_owned())
    );
    // The device that asks first is not the process's first device.
    let second = registry.load_on("scale", 1).unwrap();
    assert_eq!((second.device(), second.variant()), (1, "cu130/sm_100a"));
    assert_eq!(host.loads(), [(1, artifact("cu130/sm_100a"))]);
    let first = registry.load("scale").unwrap();
    assert_eq!((first.device(), first.variant()), (0, "cu130/sm_90a"));
    assert_eq!(
        host.loads(),
        [
            (1, artifact("cu130/sm_100a")),
            (0, artifact("cu130/sm_90a"))
        ]
    );
    // Each device keeps its own: asking again loads nothing.
    assert!(Arc::ptr_eq(
        &registry.load_on("scale", 1).unwrap().inner,
        &second.inner
    ));
    assert!(Arc::ptr_eq(
        &registry.load_on("scale", 0).unwrap().inner,
        &first.inner
    ));
    assert_eq!(host.loads().len(), 2);
    assert!(matches!(registry.plan_on("scale", 1), Plan::Loaded(kernel) if kernel.device() == 1));
    let loaded: Vec<(u32, String)> = registry
        .loaded()
        .iter()
        .map(|kernel| (kernel.device(), kernel.variant().to_owned()))
        .collect();
    assert_eq!(
        loaded,
        [
            (0, "cu130/sm_90a".to_owned()),
            (1, "cu130/sm_100a".to_owned())
        ]
    );
}

#[test]
fn a_kernel_launches_only_on_the_device_it_was_loaded_on() {
    let setup = Setup::new(&BOTH, &BOTH);
    let host = FakeHost::new(&[(0, (9, 0)), (1, (9, 0))]);
    let registry = registry(&setup, host.clone(), JitPolicy::Disabled);
    let on_one = registry.load_on("scale", 1).unwrap();
    let on_zero = registry.load_on("scale", 0).unwrap();
    launch(&on_one);
    launch(&on_one);
    launch(&on_zero);
    // An entry taken out of the kernel launches where the kernel does.
    let function = on_one.function("scale").unwrap();
    // SAFETY: as in `launch`.
    unsafe {
        function.launch(
            &LaunchConfig {
                grid: [1; 3],
                block: [1; 3],
                shared_mem_bytes: 0,
                stream: 0,
            },
            &[KernelArg::Ptr(0), KernelArg::I32(1)],
        )
    }
    .unwrap();
    assert_eq!(*host.launches.lock().unwrap(), [1, 1, 0, 1]);
    // The same cubin, one module per device.
    assert_eq!(host.loads_on(0), 1);
    assert_eq!(host.loads_on(1), 1);
}

#[test]
fn a_refusal_names_the_device_that_refused() {
    let setup = Setup::new(&BOTH, &BOTH);
    let host = FakeHost::new(&[(0, (9, 0)), (1, (8, 0))]);
    let registry = registry(&setup, host.clone(), JitPolicy::Disabled);
    let error = registry.load_on("scale", 1).unwrap_err();
    let message = crate::error_chain(&error);
    assert!(matches!(error, LoadError::NoFit { .. }), "{message}");
    assert!(
        message.contains("forbids compiling: device 1 (sm_80, compute 8.0), CUDA build cu130"),
        "{message}"
    );
    let Status::Unavailable { reason } = &registry.status_on(1)["scale"] else {
        panic!("{:?}", registry.status_on(1));
    };
    assert_eq!(reason, &message);
    // The device that fits is not affected by the one that does not.
    assert_eq!(
        registry.load_on("scale", 0).unwrap().variant(),
        "cu130/sm_90a"
    );
    assert_eq!(host.loads(), [(0, artifact("cu130/sm_90a"))]);
    // A device the host does not have is named too.
    let error = registry.load_on("scale", 7).unwrap_err();
    assert!(matches!(error, LoadError::NoGpu(_)), "{error}");
    assert_eq!(
        error.to_string(),
        "no CUDA device 7: the driver sees 2 devices"
    );
}

#[test]
fn threads_at_once_load_once_per_device() {
    let setup = Setup::new(&BOTH, &BOTH);
    let host = FakeHost::new(&[(0, (9, 0)), (1, (10, 0))]);
    let registry = registry(&setup, host.clone(), JitPolicy::Disabled);
    let barrier = Barrier::new(16);
    let kernels: Vec<Kernel> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..16u32)
            .map(|index| {
                let (registry, barrier) = (&registry, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    registry.load_on("scale", index % 2).unwrap()
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| thread.join().unwrap())
            .collect()
    });
    assert_eq!((host.loads_on(0), host.loads_on(1)), (1, 1));
    for (index, kernel) in kernels.iter().enumerate() {
        let same = &kernels[index % 2];
        assert_eq!(kernel.device(), index as u32 % 2);
        assert!(Arc::ptr_eq(&kernel.inner, &same.inner));
    }
    assert_eq!(kernels[1].variant(), "cu130/sm_100a");
}

#[test]
fn a_load_on_one_device_does_not_wait_for_another() {
    let setup = Setup::new(&BOTH, &BOTH);
    let mut host = FakeHost::new(&[(0, (9, 0)), (1, (9, 0))]);
    // Device 0's load finishes only once device 1 has loaded: a lock shared by both devices
    // would keep device 1 waiting behind it for the whole timeout.
    Arc::get_mut(&mut host).unwrap().waits_for_another = Some(0);
    let registry = registry(&setup, host.clone(), JitPolicy::Disabled);
    let began = Instant::now();
    std::thread::scope(|scope| {
        let zero = scope.spawn(|| registry.load_on("scale", 0).unwrap());
        // Device 0's load is under way (holding its lock) before device 1 asks.
        std::thread::sleep(Duration::from_millis(50));
        let one = scope.spawn(|| registry.load_on("scale", 1).unwrap());
        one.join().unwrap();
        zero.join().unwrap();
    });
    assert!(
        began.elapsed() < Duration::from_secs(4),
        "{:?}",
        began.elapsed()
    );
    assert_eq!(host.loads().first().map(|(on, _)| *on), Some(1));
}

#[test]
fn the_process_lists_every_loaded_kernel_per_device_while_it_is_held() {
    let setup = Setup::new(&BOTH, &BOTH);
    let host = FakeHost::new(&[(0, (9, 0)), (1, (10, 0))]);
    let registry = registry(&setup, host, JitPolicy::Disabled);
    registry.load_on("scale", 1).unwrap();
    registry.load_on("scale", 0).unwrap();
    // Other tests load in this process too: only this bundle's kernels count.
    let ours = || -> Vec<LoadedKernel> {
        loaded_kernels()
            .into_iter()
            .filter(|loaded| loaded.bundle == setup.bundle.path())
            .collect()
    };
    let listed = ours();
    let key = |label: &str| sha256_hex(label.as_bytes());
    assert_eq!(
        listed
            .iter()
            .map(|loaded| (
                loaded.package.as_str(),
                loaded.device,
                loaded.variant.as_str(),
                loaded.source,
                loaded.key.clone(),
                loaded.label.clone()
            ))
            .collect::<Vec<_>>(),
        [
            (
                "fake-kernels",
                1,
                "cu130/sm_100a",
                ProvenanceKind::Prebuilt,
                key("cu130/sm_100a"),
                format!(
                    "kwheel:scale cu130/sm_100a prebuilt {} cuda:1",
                    &key("cu130/sm_100a")[..12]
                )
            ),
            (
                "fake-kernels",
                0,
                "cu130/sm_90a",
                ProvenanceKind::Prebuilt,
                key("cu130/sm_90a"),
                format!(
                    "kwheel:scale cu130/sm_90a prebuilt {} cuda:0",
                    &key("cu130/sm_90a")[..12]
                )
            ),
        ]
    );
    assert!(listed[0].reason.contains("sm_100a cubin for a 10.0 device"));
    // Dropped with its registry: nothing holds the modules any more.
    drop(registry);
    assert!(ours().is_empty());
}

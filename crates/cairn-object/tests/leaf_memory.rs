//! Reading a List whose leaf holds millions of tiny elements takes memory for the leaf's
//! chunk, not for its elements: a leaf was decoded whole into 64-byte elements, so one of
//! the largest size filled with one-byte elements took about 1 GiB for each reader (the
//! node's GET of a list, its version stream, verify and GC). Measured with a counting
//! allocator (this file is its own test binary, one test at a time).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use cairn_object::postree::{self, TreeConfig, TreeKind};
use cairn_store::MemoryStore;

struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged to the system allocator.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = NOW.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) };
        NOW.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Bytes allocated at the peak of `f`, above what was allocated when it started.
fn peak_of(f: impl FnOnce()) -> usize {
    let base = NOW.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    f();
    PEAK.load(Ordering::Relaxed).saturating_sub(base)
}

#[test]
fn a_leaf_of_tiny_elements_reads_in_the_memory_of_its_chunk() {
    let store = MemoryStore::new();
    let cfg = TreeConfig::default()
        .with_leaf_target(TreeConfig::MAX_TARGET as u64)
        .unwrap();
    // Two million empty elements: one leaf of about 2 MiB (an element that does not cut
    // a leaf never does, so identical elements fill leaves to the largest size).
    const N: usize = 2 << 20;
    let t = postree::build_list(&store, &cfg, std::iter::repeat_n(b"", N)).unwrap();
    assert_eq!((t.kind, t.count), (TreeKind::List, N as u64));
    // Decoded whole, the leaf took 64 bytes an element (128 MiB here).
    let limit = 24 << 20;
    let read = peak_of(|| {
        let mut n = 0;
        for e in postree::iter(&store, &t) {
            assert!(e.unwrap().key.is_empty());
            n += 1;
        }
        assert_eq!(n, N);
    });
    assert!(read < limit, "iterating took {read} bytes at its peak");
    // From the middle, as a range read seeks.
    let ranged = peak_of(|| {
        let got: Vec<_> = postree::list_range(&store, &t, N as u64 / 2, N as u64 / 2 + 3)
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(got.len(), 3);
    });
    assert!(
        ranged < limit,
        "a range read took {ranged} bytes at its peak"
    );
    // Checking the whole tree (verify, GC, a version stream's sender).
    let walked = peak_of(|| {
        postree::walk(&store, &t, &mut |_, _| Ok(())).unwrap();
    });
    assert!(walked < limit, "walking took {walked} bytes at its peak");
}

use super::*;

#[test]
fn locate_covers_indices_contiguously() {
    let mut expect = (0usize, 0usize);
    for i in 0..10_000u32 {
        let (seg, off, len) = locate(i);
        assert_eq!((seg, off), expect, "index {i}");
        assert_eq!(len, 1 << (seg as u32 + BASE_SHIFT));
        expect = if off + 1 == len {
            (seg + 1, 0)
        } else {
            (seg, off + 1)
        };
    }
    let (seg, _, _) = locate(NIL - 1);
    assert!(seg < SEGMENTS);
}

#[test]
fn create_get_and_release_storage() {
    let table = MagazineTable::new(4);
    let n = if cfg!(miri) { 40 } else { 300 };
    let mut seen = Vec::new();
    for _ in 0..n {
        let m = table.create().expect("out of memory");
        // SAFETY: just created, so owned here.
        unsafe { table.release_slots(m) };
        seen.push(m.index);
    }
    for (i, &index) in seen.iter().enumerate() {
        assert_eq!(index, i as u32);
        // SAFETY: created above.
        let m = unsafe { table.get(index) };
        assert_eq!(m.index, index);
        // SAFETY: owned: no other thread has seen the table.
        assert!(unsafe { table.ensure_slots(m) });
    }
}

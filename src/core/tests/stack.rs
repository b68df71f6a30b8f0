use super::*;

#[test]
fn stack_is_lifo_and_conserves() {
    let table = MagazineTable::new(1);
    let stack = MagazineStack::new(MAX_GENERATION_BITS);
    let mags: Vec<_> = (0..5).map(|_| table.create().unwrap()).collect();
    for m in &mags {
        stack.push(m);
    }
    let popped: Vec<u32> = std::iter::from_fn(|| stack.pop(&table).map(|m| m.index)).collect();
    assert_eq!(popped, [4, 3, 2, 1, 0]);
    assert!(stack.take_all(&table).is_none());
}

#[test]
fn generation_advances_on_pop_and_wraps_under_its_mask() {
    let table = MagazineTable::new(1);
    let stack = MagazineStack::new(2);
    let m = table.create().unwrap();
    for round in 1..=5u32 {
        stack.push(m);
        assert!(stack.pop(&table).is_some());
        let (generation, top) = unpack(stack.head.load(Ordering::Relaxed));
        assert_eq!((generation, top), (u64::from(round & 3), NIL));
    }
}

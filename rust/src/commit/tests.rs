//! Tests of the temp-file locking race in `commit` (a cleanup that unlinks a temp before its
//! writer locks it).

use super::*;
use std::cell::Cell;
use std::io::Read;

/// A concurrent cleanup that finds the temp file in the moment between its create and its
/// lock unlinks it; the writer must notice and end up holding a file the path still names.
#[test]
fn temp_unlinked_before_its_lock_is_created_again() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir
        .path()
        .join("ck.data-00000-of-00001.tmp-00000000000000aa");
    let swept = Cell::new(0);
    let cleanup = |p: &Path| {
        if swept.get() == 0 {
            let held = claim_abandoned(p).expect("not locked yet: cleanup may take it");
            fs::remove_file(p).unwrap();
            drop(held);
        }
        swept.set(swept.get() + 1);
    };
    let mut f = create_locked_temp_with(&tmp, &tmp, "create", &cleanup).unwrap();
    assert_eq!(swept.get(), 2, "created a second time");
    f.write_all(b"payload").unwrap();
    let mut got = String::new();
    File::open(&tmp).unwrap().read_to_string(&mut got).unwrap();
    assert_eq!(got, "payload", "the writes reach the file the path names");
    // and now that it is locked, no cleanup can take it
    assert!(claim_abandoned(&tmp).is_none());
    drop(f);
    assert!(
        claim_abandoned(&tmp).is_some(),
        "its writer gone, it is abandoned"
    );
}

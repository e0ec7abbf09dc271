//! Tests of `notify.rs`: the parser of the group's records.

use super::*;

#[test]
fn mounts_below_a_root_are_found_with_escaped_names() {
    let info = "22 1 8:1 / / rw - ext4 /dev/vda rw\n\
                30 22 0:5 / /w/build rw - tmpfs t rw\n\
                31 22 0:6 / /w/my\\040disk rw - ext4 /dev/vdb rw\n\
                32 22 0:7 / /w rw - ext4 /dev/vdc rw\n\
                33 22 0:8 / /wx rw - tmpfs t rw\n";
    assert_eq!(
        mounts_under(Path::new("/w"), info),
        vec![PathBuf::from("/w/build"), PathBuf::from("/w/my disk")]
    );
}

fn info_fid(info_type: u8, fsid: [i32; 2], handle: &[u8], name: &[u8]) -> Vec<u8> {
    let mut r = vec![info_type, 0, 0, 0];
    r.extend(fsid[0].to_ne_bytes());
    r.extend(fsid[1].to_ne_bytes());
    r.extend((handle.len() as u32).to_ne_bytes());
    r.extend(1i32.to_ne_bytes());
    r.extend(handle);
    r.extend(name);
    r.push(0);
    while r.len() % 4 != 0 {
        r.push(0);
    }
    let len = r.len() as u16;
    r[2..4].copy_from_slice(&len.to_ne_bytes());
    r
}

fn event(mask: u64, pid: i32, infos: &[Vec<u8>]) -> Vec<u8> {
    let body: Vec<u8> = infos.concat();
    let mut e = Vec::new();
    e.extend(((24 + body.len()) as u32).to_ne_bytes());
    e.extend([3u8, 0]);
    e.extend(24u16.to_ne_bytes());
    e.extend(mask.to_ne_bytes());
    e.extend((-1i32).to_ne_bytes());
    e.extend(pid.to_ne_bytes());
    e.extend(body);
    e
}

#[test]
fn a_create_and_a_rename_parse_with_their_entries() {
    let mut buf = event(
        libc::FAN_CREATE,
        42,
        &[
            info_fid(
                libc::FAN_EVENT_INFO_TYPE_DFID_NAME,
                [1, 2],
                &[9; 8],
                b"a.txt",
            ),
            info_fid(libc::FAN_EVENT_INFO_TYPE_FID, [1, 2], &[7; 8], b""),
        ],
    );
    buf.extend(event(
        libc::FAN_RENAME,
        43,
        &[
            info_fid(
                libc::FAN_EVENT_INFO_TYPE_OLD_DFID_NAME,
                [1, 2],
                &[9; 8],
                b"a.txt",
            ),
            info_fid(
                libc::FAN_EVENT_INFO_TYPE_NEW_DFID_NAME,
                [1, 2],
                &[8; 12],
                b"b",
            ),
        ],
    ));
    let events = parse(&buf);
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].tid, 42);
    let entry = events[0].entry.as_ref().unwrap();
    assert_eq!(entry.name, b"a.txt");
    assert_eq!(entry.dir.bytes, vec![9; 8]);
    assert_eq!(entry.dir.fsid, [1, 2]);
    assert!(events[0].new_entry.is_none());
    let fid = events[0].fid.as_ref().unwrap();
    assert_eq!((fid.bytes.as_slice(), fid.fsid), (&[7u8; 8][..], [1, 2]));
    assert!(events[1].fid.is_none());
    assert_eq!(events[1].entry.as_ref().unwrap().name, b"a.txt");
    let new = events[1].new_entry.as_ref().unwrap();
    assert_eq!((new.name.as_slice(), new.dir.bytes.len()), (&b"b"[..], 12));
}

#[test]
fn a_cut_or_lying_record_ends_the_parse() {
    let buf = event(libc::FAN_CREATE, 1, &[info_fid(2, [0, 0], &[1; 8], b"x")]);
    assert!(parse(&buf[..buf.len() - 1]).is_empty());
    let mut lying = buf.clone();
    lying[0..4].copy_from_slice(&1000u32.to_ne_bytes());
    assert!(parse(&lying).is_empty());
    let mut bad_info = buf;
    bad_info[26..28].copy_from_slice(&500u16.to_ne_bytes());
    let events = parse(&bad_info);
    assert_eq!(events.len(), 1);
    assert!(
        events[0].entry.is_none(),
        "an info record longer than its event is ignored"
    );
}

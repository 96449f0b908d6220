//! The pool's hand-over rules without a data plane: roles go only to a worker asleep
//! in its wait (and claimed, so two senders never pick the same one), never to the
//! sender itself; a worker learns of a role once and its wake-up file is emptied then;
//! jobs come back to the pool emptied.

use super::*;

fn peer_arc() -> Arc<Peer> {
    let dev = crate::testutil::one_peer_device(
        crate::testutil::private_key(),
        crate::testutil::private_key(),
        "10.0.0.2/32",
        "192.0.2.2:51820".parse().expect("addr"),
        None,
    );
    dev.snapshot().peers()[0].clone()
}

#[test]
fn roles_go_only_to_idle_workers_once_claimed() {
    let sp = Spread::new(3).expect("eventfds");
    let p = peer_arc();
    // Nobody asleep: the sender keeps the role.
    assert!(sp.hand_off(0, Role::Write(p.clone())).is_err());
    assert!(!sp.anyone_idle(0));
    // Only the sender asleep: still nobody else.
    sp.set_idle(0, true);
    assert!(sp.hand_off(0, Role::Write(p.clone())).is_err());
    // Worker 2 asleep: it gets the role, is claimed (no longer idle), and woken.
    sp.set_idle(2, true);
    assert!(sp.anyone_idle(0));
    assert!(sp.hand_off(0, Role::Decrypt(p.clone())).is_ok());
    assert!(
        sp.hand_off(1, Role::Write(p.clone())).is_ok(),
        "worker 0 is idle"
    );
    assert!(
        sp.hand_off(1, Role::Write(p.clone())).is_err(),
        "both claimed"
    );
    // Worker 2 wakes: one role, told once; its wake-up file emptied.
    assert!(sp.take_wake(2));
    assert!(matches!(sp.next_role(2), Some(Role::Decrypt(_))));
    assert!(sp.next_role(2).is_none());
    assert!(!sp.take_wake(2), "told once");
    assert!(
        sp.wake_fd(2).expect("fd").read().is_err(),
        "emptied (EAGAIN)"
    );
    assert!(sp.take_wake(0) && matches!(sp.next_role(0), Some(Role::Write(_))));
    assert!(!sp.take_wake(1) && sp.next_role(1).is_none());
}

#[test]
fn jobs_come_back_emptied_and_the_pool_runs_dry() {
    let sp = Spread::new(1).expect("eventfds");
    let ids: Vec<_> = std::iter::from_fn(|| sp.take_job()).collect();
    assert_eq!(ids.len(), JOBS_PER_WORKER);
    assert_eq!(
        sp.stats.no_job.load(Ordering::Relaxed),
        1,
        "the dry take counted"
    );
    let id = ids[0];
    {
        let mut j = sp.job(id);
        j.peer = Some(peer_arc());
        let s = j.opened.slot(100).expect("room");
        s[..3].copy_from_slice(b"abc");
        j.opened.commit(3);
        assert_eq!(j.opened.packets().collect::<Vec<_>>(), [b"abc"]);
        assert!(j.opened.slot(JOB_BYTES).is_none(), "no room past the job");
    }
    sp.free_job(id);
    let again = sp.take_job().expect("one back");
    let j = sp.job(again);
    assert!(j.peer.is_none() && j.opened.packets().next().is_none());
}

/*
 * Bounded-time aggregation (a job's deadline): the message types, constants and
 * counter indexes both programs share. Each program tracks rounds its own way
 * (v1model/control/round_tracker.p4, tna/control/round_tracker.p4); deadline_t is
 * v1model's per-packet state.
 *
 * A worker whose contribution has waited its job's deadline sends RELEASE for that
 * (slot, set): the switch sends what it holds to every worker as RELEASED, a result
 * whose `contributions` is how many it sums and whose `fingerprint` is the bitmap of
 * who is in it. A contribution that comes after the release gets the same packet back,
 * as a retransmission gets a stored result, so every worker applies the same bits.
 *
 * Workers then move on without the late one, so a (slot, set) may see a later round
 * while a late worker still sends an earlier one. Every worker sends a round with the
 * same packet id (transport.py: ids count the packets sent in a slot), so a deadline
 * job's (slot, set) keeps the id of its round: a packet with that id belongs to it, a
 * newer one starts the next round, an older one is stale and dropped.
 *
 * A call spans many rounds of each slot, and a rank that missed one round will miss
 * the next ones too: waiting the deadline again in each would cost more than the late
 * rank does. So once a round was released without some workers, the workers send their
 * rounds as QUORUM contributions carrying, in `contributions`, how many workers the
 * release held: the switch releases such a round the moment that many are in, exactly
 * as a deadline release does. The quorum lives in the packets, not here: the workers
 * drop it once a released round has the missing workers in again (worker/transport.py).
 * The Tofino program counts a QUORUM as a plain contribution, so there every round is
 * released at the deadline (tna/control/round_tracker.p4 says why).
 */
#ifndef _DEADLINE_P4_
#define _DEADLINE_P4_

const bit<8> MSG_RELEASE = 4;     // worker to switch: release this (slot, set) now
const bit<8> MSG_RELEASED = 5;    // switch to workers: a released partial sum
const bit<8> MSG_QUORUM = 6;      // worker to switch: a contribution, released at a quorum

// In the counts register of a deadline job's (slot, set): its round was released at its
// quorum (above MAX_WORKERS, so never a count), and later packets get that result.
const count_t QUORUM_FLAG = 0x40;

// A packet id at most this many rounds behind its (slot, set)'s is stale; any other
// id than the round's is newer (ids wrap at 2^32). A late worker trails the others
// by the rounds they finish without it: far fewer.
const bit<32> STALE_ROUNDS = 0x1000;

// Index (per job: job_id * 4 + outcome) into the deadline_outcomes counter.
const bit<32> DEADLINE_RELEASED = 0;          // a release sent a partial sum to every worker
const bit<32> DEADLINE_LATE = 1;              // a contribution after a release, answered with it
const bit<32> DEADLINE_STALE = 2;             // a packet of an older round: dropped
const bit<32> DEADLINE_RELEASE_REFUSED = 3;   // a release or quorum for no round, or of a job without a deadline
const bit<32> DEADLINE_QUORUM = 4;            // a QUORUM contribution released its round
const bit<32> DEADLINE_OUTCOMES = 5;

struct deadline_t {
    bit<1> on;          // the job has a deadline (the deadline_jobs table)
    bit<1> release;     // the packet is a RELEASE
    bit<1> released;    // the round the packet names was released
    bit<1> fresh;       // it starts its (slot, set)'s next round: the set's bitmap starts over
    bit<1> stale;       // it names an older round
    bit<1> empty;       // a release for a round nobody has contributed to
    bit<1> as_released; // the packet leaves as RELEASED
    bit<1> record;      // a release: the fingerprint register keeps who is in the round
    bit<1> quorum;      // the packet is a QUORUM contribution
    bit<1> reached;     // and with it, its round holds as many workers as it asks
}

#endif  // _DEADLINE_P4_

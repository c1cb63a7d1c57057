/*
 * Types, constants and enums shared by every control and by the Python side.
 *
 * p4src/protocol.py parses this file (the `const` lines and the `enum` blocks),
 * so the controller, the worker and the tests never keep a second copy.
 * Keep every enum on its own lines: `NAME = value,`.
 */
#ifndef _DEFINE_P4_
#define _DEFINE_P4_

#include "size.p4"

typedef bit<48> mac_addr_t;
typedef bit<32> ipv4_addr_t;
typedef bit<9>  port_t;            // v1model's standard_metadata port width
typedef bit<8>  job_id_t;
typedef bit<15> slot_t;            // pool index on the wire; POOL_SIZE <= 2^15
typedef bit<1>  set_t;             // shadow set of a slot
typedef bit<16> cell_t;            // register index of one (slot, set): slot ++ set
typedef bit<5>  worker_id_t;       // log2(MAX_WORKERS)
typedef bit<32> worker_bitmap_t;   // one bit per worker, MAX_WORKERS = 32
typedef bit<64> bitmap_pair_t;     // {set 1 bitmap, set 0 bitmap}: one register word per slot
typedef bit<32> value_t;           // int32, two's complement, big-endian on the wire
typedef int<8>  exponent_t;        // block floating point exponent
typedef bit<8>  count_t;           // contributions so far; counts up to MAX_WORKERS
typedef bit<32> fingerprint_t;     // a call's fingerprint, summed like a value (wrapping)
typedef bit<32> pkt_id_t;
typedef bit<16> mcast_group_t;     // v1model's mcast_grp width
typedef bit<32> drop_probability_t;  // P(drop) = value / 2^32, drawn with random()

const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<16> ETHERTYPE_ARP = 0x0806;
const bit<8>  IP_PROTO_UDP = 17;
const bit<16> ARP_OPER_REQUEST = 1;
const bit<16> ARP_OPER_REPLY = 2;

// Aggregation packets go to a UDP destination port in BASE..BASE+15 (SwitchML's
// 0xBEE0/0xFFF0 range): the parser needs a fixed pattern, and the jobs table then
// binds each job to one port of the range.
const bit<16> AGG_UDP_PORT_BASE = 0xBEE0;
const bit<16> AGG_UDP_PORT_MASK = 0xFFF0;

// Broadcast, ARP and unknown unicast are flooded through this PRE group: the
// highest id P4Runtime servers accept (PI reserves 2^15 and up for clone sessions).
// Job groups are numbered from 1 and must stay below it.
const mcast_group_t FLOOD_MCAST_GROUP = 0x7FFF;

// Where the controller's PacketOut frames enter (simple_switch_grpc --cpu-port):
// above every front-panel port of our topologies (at most 250), below v1model's
// drop port 511. Only frames from this port are parsed as a packet_out header.
const port_t CPU_PORT = 255;

// Set in a (slot, set)'s contribution count once a leaf holds its parent's result
// for it (see ContributionCounter): count_t has a bit to spare above MAX_WORKERS.
const count_t FINAL_FLAG = 0x80;

// Exponent a worker sends for a block that is all zeros: smaller than any real one.
const exponent_t EXPONENT_OF_ZERO = -128;

enum bit<8> MsgType {
    CONTRIBUTION = 1,
    RESULT = 2,
    WAITING = 3           // short answer to a retransmission for an unfinished (slot, set)
}

// What the switch does with a (slot, set)'s registers for one packet.
enum bit<8> RegisterOp {
    NONE = 0,
    WRITE = 1,
    ADD = 2,
    READ = 3
}

// The controller's command in a PacketOut.
enum bit<8> ControlOp {
    RESET_SLOT = 1
}

// Where an aggregation packet goes after ingress.
enum bit<8> NextStep {
    FORWARD_L2 = 0,
    DROP = 1,
    MULTICAST = 2,
    UNICAST = 3,
    UPSTREAM = 4,         // a leaf's partial sum, to its parent switch
    WAITING = 5           // a short reply to the sender: who has contributed so far
}

// Index into the ingress_outcomes counter: exactly one per frame the switch
// receives (PacketOuts from the controller included), so the counters account for
// every frame.
enum bit<8> IngressOutcome {
    CONSUMED = 0,
    COMPLETED = 1,
    RESENT = 2,
    DUPLICATE_DROPPED = 3,
    MALFORMED = 4,
    UNKNOWN_JOB = 5,
    UNKNOWN_SENDER = 6,
    BAD_SLOT = 7,
    SIMULATED_DROP = 8,
    SPOOFED_SOURCE = 9,   // any frame claiming a service address as its source: dropped
    FORWARDED_L2 = 10,    // not aggregation: answered by the ARP responder or switched at L2
    SLOT_RESET = 11,      // the controller's PacketOut cleared a slot
    SENT_UP = 12,         // a leaf's local sum is complete: sent to the parent as one contribution
    RESENT_UP = 13,       // a worker retransmitted before the parent's result came: partial resent
    PARENT_RESULT = 14,   // the parent's result: stored, multicast to the leaf's workers
    WAITING_SENT = 15,    // a retransmission for an unfinished (slot, set), answered with who has contributed
    PARENT_WAITING = 16   // the parent's WAITING reply to a resent partial sum: dropped
}

// Index into the egress_outcomes counter: one per result copy or partial sum leaving
// the switch.
enum bit<8> EgressOutcome {
    MULTICAST_COPY = 0,
    UNICAST_RESEND = 1,
    SIMULATED_DROP = 2,   // a result copy or a partial sum, dropped by the loss simulator
    UPSTREAM = 3,         // a partial sum leaving a leaf for its parent
    WAITING_REPLY = 4     // a WAITING reply leaving for the worker that retransmitted
}

#endif  // _DEFINE_P4_

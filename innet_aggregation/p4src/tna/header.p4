/*
 * What the TNA program adds to shared/header.p4: the bridged header, the header
 * struct both gresses parse into, the register pair types and the egress metadata.
 *
 * Ingress metadata is shared/header.p4's metadata_t, unchanged, so the controls keep
 * the v1model field names (meta.seen, meta.first, meta.done, meta.count, ...).
 * On v1model it reaches egress by itself; on Tofino what egress needs travels in
 * bridge_h, in front of the packet.
 */
#ifndef _TNA_HEADER_P4_
#define _TNA_HEADER_P4_

#include "../shared/header.p4"
#include "unroll.p4"

// The recirculation port a result takes for its second pass (see README: one pass
// sums all 64 values but a stateful ALU returns one word of its pair). 68 is pipe
// 0's recirculation port on Tofino 1; the workers' ports must be in the same pipe,
// since every pipe has its own copy of the registers.
#ifndef AGG_RECIRC_PORT
#define AGG_RECIRC_PORT 68
#endif

// Ingress -> egress metadata, and the header a result carries around the
// recirculation loop (ingress parses it back on AGG_RECIRC_PORT). Fixed layout,
// not @flexible, because it goes over the wire of the loopback port.
header bridge_h {
    NextStep      next_step;     // 8: where the packet goes (MULTICAST/UNICAST on both passes)
    bit<1>        recirculate;   // pass 1 of a result: egress returns it to ingress as is
    bit<1>        flooded;       // L2 flood: egress prunes the copy to the ingress port
    bit<5>        _pad0;
    port_t        ingress_port;  // the worker's port (unicast resend, flood pruning)
    bit<3>        _pad1;
    worker_id_t   worker_id;     // the sender, for a unicast resend's address
    mcast_group_t job_group;     // the job's PRE group, for pass 2 of a multicast
    // A WAITING reply's bitmap, which egress writes into agg_h.fingerprint: ingress
    // writing it there would have to wait for FingerprintSum's read (stage 11).
    worker_bitmap_t contributors;
}

// The key of the aggregation packet's checks, which BitmapChecker's table and
// RoundTracker's two tables share (the same stage: none can wait for another's
// verdict); each names its inputs so.
#define ADMISSION_KEY \
    ingress_port:      ternary @name("ingress_port"); \
    loss_draw:         ternary @name("loss_draw"); \
    parser_err:        ternary @name("parser_err"); \
    hdr.udp.length:    ternary @name("udp_length"); \
    hdr.agg.msg_type:  ternary @name("msg_type"); \
    deadline:          ternary @name("deadline"); \
    job_found:         ternary @name("job_found"); \
    hdr.agg.slot:      ternary @name("slot"); \
    in_range:          ternary @name("in_range"); \
    meta.known_sender: ternary @name("known_sender");

// The start of an ARP header, looked at before it is parsed (parser.p4).
header arp_probe_h {
    bit<16> htype;
    bit<16> ptype;
    bit<16> hlen_plen;
    bit<16> oper;
}

struct tna_headers_t {
    bridge_h   bridge;
    ethernet_h ethernet;
    arp_h      arp;
    ipv4_h     ipv4;
    udp_h      udp;
    agg_h      agg;
    values_h   values;
}

// One register word per (slot, set): who has contributed to its round, and the
// round's packet id (BitmapChecker).
struct bitmap_round_t {
    worker_bitmap_t bitmap;
    pkt_id_t        id;
}

// A deadline job's (slot, set): its round's packet id, and whether it was released
// (RoundTracker).
struct round_state_t {
    pkt_id_t id;
    bit<32>  released;
}

// Two sums per register word: v(2p) in lo, v(2p+1) in hi. Signed, so that |+| in
// a RegisterAction is the stateful ALU's signed saturating add (sadds).
struct value_pair_t {
    int<32> lo;
    int<32> hi;
}

struct egress_metadata_t {
    bool update_ipv4_checksum;   // a result was re-addressed: the deparser recomputes it
}

#endif  // _TNA_HEADER_P4_

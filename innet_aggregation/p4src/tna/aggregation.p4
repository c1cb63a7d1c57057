/*
 * In-network gradient aggregation for Tofino 1 (TNA), after SwitchML (NSDI'21).
 * Compiled with bf-p4c: see README.md in this directory.
 *
 * The same program as v1model/aggregation.p4, with the same controls, tables and
 * counters: workers send CONTRIBUTION packets of VALUES_PER_PACKET int32 values to
 * a slot of the pool; the switch sums them per (slot, shadow set); the last
 * contribution leaves as a RESULT multicast to every worker of the job; a worker
 * that retransmits for a finished slot gets the stored result back by unicast,
 * one that retransmits for an unfinished slot and asks gets a WAITING reply (who
 * has contributed). Results carry the sum of the workers' call fingerprints. A job
 * with a deadline may have a round released before every worker has contributed
 * (shared/deadline.p4): its workers get the partial sum and who is in it.
 * Everything else is switched at L2.
 *
 * Tofino differences (README.md has the full list):
 *  - every register is a Register + RegisterActions (one stateful ALU each); the
 *    64 sums live in 32 pairs of 32-bit words;
 *  - a stateful ALU returns one word per packet, so a result (completed or
 *    resent) recirculates once: pass 1 updates and reads the high words, pass 2
 *    reads the low words and sends. Consumed contributions take one pass;
 *  - what egress needs travels in bridge_h;
 *  - a (slot, set)'s bitmap word holds its round's packet id, and a newer id starts
 *    the set over (v1model re-arms the other set); a deadline job's rounds are
 *    released at the deadline only, never at a quorum (control/round_tracker.p4).
 */
#include <core.p4>
#include <tna.p4>

#include "header.p4"
#include "../shared/deadline.p4"
#include "parser.p4"
#include "control/l2_forwarding.p4"
#include "control/arp_responder.p4"
#include "control/drop_simulator.p4"
#include "control/job_lookup.p4"
#include "control/sender_identification.p4"
#include "control/round_tracker.p4"
#include "control/bitmap_checker.p4"
#include "control/contribution_counter.p4"
#include "control/next_step_selector.p4"
#include "control/value_pair.p4"
#include "control/value_aggregator.p4"
#include "control/exponent_max.p4"
#include "control/fingerprint_sum.p4"
#include "control/result_rewrite.p4"

control AggIngress(inout tna_headers_t hdr,
                   inout metadata_t meta,
                   in ingress_intrinsic_metadata_t ig_intr_md,
                   in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                   inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                   inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    DropSimulator()        ingress_loss;
    ArpResponder()         arp_responder;
    L2Forwarding()         l2_forwarding;
    JobLookup()            job_lookup;
    SenderIdentification() sender_identification;
    RoundTracker()         round_tracker;
    BitmapChecker()        bitmap_checker;
    ContributionCounter()  contribution_counter;
    NextStepSelector()     next_step_selector;
    ValueAggregator()      value_aggregator;
    ExponentMax()          exponent_max;
    FingerprintSum()       fingerprint_sum;

    Counter<bit<64>, bit<8>>(NUM_INGRESS_OUTCOMES, CounterType_t.PACKETS_AND_BYTES) ingress_outcomes;
    // Per job (job_id * 8 + outcome: a cell index is a field or a hash of fields,
    // never a sum, so the job's cells start at a power of two, and the controller
    // reads the stride from the counter's size): what its deadline did.
    Counter<bit<32>, bit<32>>(256 * 8, CounterType_t.PACKETS) deadline_outcomes;
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) deadline_cell;

    // Written by BitmapChecker for every aggregation packet (bitmap_before only
    // where aggregate is 1).
    worker_bitmap_t bitmap_before;
    bit<1> aggregate;
    bit<1> harvest;
    // A deadline job's (shared/deadline.p4): RoundTracker's answers, BitmapChecker's
    // message kind, and what NextStepSelector made of them.
    bit<1> deadline;
    bit<32> age;
    bit<32> released;
    bit<1> release;
    bit<1> quorum;
    bit<1> as_released;
    bit<1> record;
    bit<1> deadline_counted;
    bit<3> deadline_outcome;

    // What egress (and pass 2) needs of ingress's decision.
    action set_bridge(in NextStep next_step, in bit<1> recirculate,
                      in worker_id_t worker_id, in mcast_group_t job_group,
                      in worker_bitmap_t contributors) {
        hdr.bridge.setValid();
        hdr.bridge.next_step = next_step;
        hdr.bridge.recirculate = recirculate;
        hdr.bridge.flooded = 0;
        hdr.bridge._pad0 = 0;
        hdr.bridge.ingress_port = ig_intr_md.ingress_port;
        hdr.bridge._pad1 = 0;
        hdr.bridge.worker_id = worker_id;
        hdr.bridge.job_group = job_group;
        hdr.bridge.contributors = contributors;
    }

    // A contribution that completed its slot, or a retransmission for a finished
    // one: the packet becomes the result, from the service address it was sent to,
    // and ends pass 1 at the recirculation port, with the decision in bridge_h for
    // pass 2 (and, there, for egress).
    action recirculate_result() {
        ingress_outcomes.count((bit<8>)meta.outcome);
        hdr.agg.msg_type = MsgType.RESULT;
        hdr.agg.contributions = meta.total_workers;
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.udp.src_port = hdr.udp.dst_port;
        hdr.udp.checksum = 0;  // the payload changed; 0 means "none" in IPv4
        set_bridge(meta.next_step, 1, meta.worker_id, meta.job_group, 0);
        ig_tm_md.ucast_egress_port = AGG_RECIRC_PORT;
    }

    // A released round, to every worker or to one: as a result, but typed RELEASED and
    // counting who is in it (the fingerprint field, read in stage 11, names them).
    action recirculate_released() {
        ingress_outcomes.count((bit<8>)meta.outcome);
        hdr.agg.msg_type = (MsgType)MSG_RELEASED;
        hdr.agg.contributions = meta.count;
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.udp.src_port = hdr.udp.dst_port;
        hdr.udp.checksum = 0;
        set_bridge(meta.next_step, 1, meta.worker_id, meta.job_group, 0);
        ig_tm_md.ucast_egress_port = AGG_RECIRC_PORT;
    }

    // A retransmission for an unfinished slot that asks: the header alone goes back
    // to the sender, in this pass, with the count of contributions; egress puts the
    // bitmap (the set's as it was, which holds the sender: it is a retransmission)
    // in its fingerprint field.
    action reply_waiting() {
        ingress_outcomes.count((bit<8>)meta.outcome);
        hdr.agg.msg_type = MsgType.WAITING;
        hdr.agg.contributions = meta.count;
        hdr.values.setInvalid();
        hdr.ipv4.total_len = WAITING_IPV4_LENGTH;
        hdr.udp.length = WAITING_UDP_LENGTH;
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.udp.src_port = hdr.udp.dst_port;
        hdr.udp.checksum = 0;
        set_bridge(NextStep.WAITING, 0, meta.worker_id, meta.job_group, bitmap_before);
        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port;
    }

    // Consumed, a duplicate, or refused.
    action drop_contribution() {
        ingress_outcomes.count((bit<8>)meta.outcome);
        ig_dprsr_md.drop_ctl = 1;
    }

    // Pass 2: everything was decided and counted in pass 1, and the low words of
    // the sums were read on the way here.
    action send_multicast() {
        hdr.bridge.recirculate = 0;
        ig_tm_md.mcast_grp_a = hdr.bridge.job_group;
    }

    action send_unicast() {
        hdr.bridge.recirculate = 0;
        ig_tm_md.ucast_egress_port = hdr.bridge.ingress_port;
    }

    // Where an aggregation packet goes, as a table rather than if/else (see apply).
    table send {
        key = {
            harvest:               ternary @name("harvest");
            meta.next_step:        ternary @name("next_step");
            hdr.bridge.next_step:  ternary @name("bridge_next_step");
            as_released:           ternary @name("as_released");
        }
        actions = { recirculate_result; recirculate_released; reply_waiting; drop_contribution;
                    send_multicast; send_unicast; NoAction; }
        const entries = {
            (1, _, NextStep.MULTICAST, _): send_multicast();
            (1, _, _, _):                  send_unicast();
            (0, NextStep.MULTICAST, _, 1): recirculate_released();
            (0, NextStep.UNICAST, _, 1):   recirculate_released();
            (0, NextStep.MULTICAST, _, _): recirculate_result();
            (0, NextStep.UNICAST, _, _):   recirculate_result();
            (0, NextStep.WAITING, _, _):   reply_waiting();
            (0, _, _, _):                  drop_contribution();
        }
        // Never taken. A counting action cannot be a default action on Tofino (its
        // index needs the hash distribution unit).
        const default_action = NoAction();
        size = 8;
    }

    // Not aggregation: answered by the ARP responder or switched at L2. Bridged
    // metadata, so that egress prunes the flood copy to the ingress port.
    action bridge_l2() {
        ingress_outcomes.count((bit<8>)IngressOutcome.FORWARDED_L2);
        set_bridge(NextStep.FORWARD_L2, 0, 0, 0, 0);
    }

    apply {
        if (meta.is_agg) {
            // One flat sequence of tables, each keyed on what decides it (pass 2 by
            // `harvest`, a checked contribution by `aggregate`) instead of nested
            // if/else. On Tofino 1 a table that follows an if block waits for every
            // table inside it (the next-table chain), and nesting cost four stages.
            // Stage 0: the lookups; 1: the loss draw; 2: the checks and the bitmap,
            // one table, and the round's state (RoundTracker) behind the same checks;
            // 3-11: the 35 stateful ALUs of count, exponents, fingerprints and sums,
            // with the decision beside them.
            meta.cell = hdr.agg.slot ++ hdr.agg.set;
            bit<32> loss_draw;
            bit<1> job_found;
            bit<1> in_range;
            ingress_loss.apply(ig_intr_md.ingress_port, loss_draw);
            job_lookup.apply(hdr, meta, job_found, in_range);
            sender_identification.apply(hdr, meta, ig_intr_md.ingress_port);
            round_tracker.apply(hdr, meta, ig_intr_md.ingress_port, ig_prsr_md.parser_err,
                                loss_draw, job_found, in_range, deadline, age, released);
            bitmap_checker.apply(hdr, meta, ig_intr_md.ingress_port, ig_prsr_md.parser_err,
                                 loss_draw, deadline, job_found, in_range, bitmap_before,
                                 aggregate, harvest, release, quorum, deadline_counted,
                                 deadline_outcome);
            contribution_counter.apply(meta, bitmap_before, aggregate, release, released, age);
            next_step_selector.apply(meta, aggregate, hdr.agg.contributions, deadline, release,
                                     quorum, released, age, deadline_counted,
                                     deadline_outcome, as_released, record);
            exponent_max.apply(hdr, meta, bitmap_before, aggregate, release, released, age);
            fingerprint_sum.apply(hdr, meta, bitmap_before, aggregate, release, released, age,
                                  record);
            // Applied once, for both passes: its 32 registers must be the same ones
            // on pass 1 and pass 2.
            value_aggregator.apply(hdr, meta, bitmap_before, aggregate, harvest, release,
                                   released, age);
            send.apply();
            if (deadline_counted == 1) {
                deadline_outcomes.count(deadline_cell.get({hdr.agg.job_id, deadline_outcome}));
            }
        } else {
            bridge_l2();
            bool replied;
            arp_responder.apply(hdr, ig_intr_md.ingress_port, ig_tm_md, replied);
            if (!replied) {
                l2_forwarding.apply(hdr, meta, ig_tm_md);
                if (meta.flooded) {
                    hdr.bridge.flooded = 1;
                }
            }
        }
    }
}

control AggEgress(inout tna_headers_t hdr,
                  inout egress_metadata_t meta,
                  in egress_intrinsic_metadata_t eg_intr_md,
                  in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                  inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                  inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {
    DropSimulator() egress_loss;
    ResultRewrite() result_rewrite;

    Counter<bit<64>, bit<8>>(NUM_EGRESS_OUTCOMES, CounterType_t.PACKETS_AND_BYTES) egress_outcomes;

    apply {
        if (hdr.bridge.recirculate == 1) {
            // Pass 1 of a result on its way to the recirculation port: leaves as it
            // is, bridge_h included, and is neither lost nor counted here.
        } else {
            if (hdr.bridge.next_step == NextStep.MULTICAST
                    || hdr.bridge.next_step == NextStep.UNICAST
                    || hdr.bridge.next_step == NextStep.WAITING) {
                bit<32> loss_draw;
                EgressOutcome outcome = EgressOutcome.UNICAST_RESEND;
                worker_id_t worker = hdr.bridge.worker_id;
                if (hdr.bridge.next_step == NextStep.MULTICAST) {
                    outcome = EgressOutcome.MULTICAST_COPY;
                    worker = (worker_id_t)eg_intr_md.egress_rid;
                } else if (hdr.bridge.next_step == NextStep.WAITING) {
                    outcome = EgressOutcome.WAITING_REPLY;
                    hdr.agg.fingerprint = hdr.bridge.contributors;
                }
                egress_loss.apply(eg_intr_md.egress_port, loss_draw);
                if (loss_draw != LOSS_KEPT) {
                    eg_dprsr_md.drop_ctl = 1;
                    outcome = EgressOutcome.SIMULATED_DROP;
                } else {
                    result_rewrite.apply(hdr, eg_dprsr_md, hdr.agg.job_id, worker);
                    meta.update_ipv4_checksum = true;
                }
                egress_outcomes.count((bit<8>)outcome);
            } else if (hdr.bridge.flooded == 1
                       && eg_intr_md.egress_port == hdr.bridge.ingress_port) {
                eg_dprsr_md.drop_ctl = 1;  // never flood back where it came from
            }
            hdr.bridge.setInvalid();   // bridged metadata never leaves the switch
        }
    }
}

Pipeline(AggIngressParser(),
         AggIngress(),
         AggIngressDeparser(),
         AggEgressParser(),
         AggEgress(),
         AggEgressDeparser()) pipe;

Switch(pipe) main;

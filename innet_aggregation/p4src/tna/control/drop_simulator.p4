/*
 * Loss simulator: each port may carry a drop probability, drawn per aggregation
 * packet. Instantiated twice, as ingress_loss and egress_loss.
 *
 * TNA form of v1model/control/drop_simulator.p4. v1model's random(draw, 0, 2^32-1)
 * becomes the Random<bit<32>> extern, and draw < p (a 32-bit compare of two
 * fields, which a Tofino gateway cannot do in one step) becomes a saturating add
 * of ~p: draw + (2^32-1-p) stays below 2^32-1 exactly when draw < p, so
 *     drop  <=>  (draw |+| ~p) != 0xFFFFFFFF
 * and P(drop) = p / 2^32 as on v1model (p = 0 never drops). The controller writes
 * the same p to the same table.
 *
 * The control hands out the sum, not a bool: ingress matches it in BitmapChecker's
 * table (LOSS_KEPT: kept) in the stage after the sum, where a bool would need a
 * gateway and one stage more.
 */
#ifndef _TNA_DROP_SIMULATOR_P4_
#define _TNA_DROP_SIMULATOR_P4_

// draw |+| ~p for a packet that is kept.
const bit<32> LOSS_KEPT = 0xFFFFFFFF;

control DropSimulator(in port_t port, out bit<32> draw) {
    Random<bit<32>>() rng;
    drop_probability_t complement;   // ~p

    action set_drop_probability(drop_probability_t p) {
        complement = ~p;
    }

    // No entry: p = 0. A default action rather than an initial value, which would
    // be a write before the table's and push the table a stage down.
    action no_loss() {
        complement = 0xFFFFFFFF;
    }

    table drop_probability {
        key = { port: exact @name("port"); }
        actions = { set_drop_probability; @defaultonly no_loss; }
        const default_action = no_loss();
        size = PORT_TABLE_SIZE;
    }

    apply {
        drop_probability.apply();
        // The sum, not the test, saturates: a gateway cannot hold the addition.
        draw = rng.get() |+| complement;
    }
}

#endif  // _TNA_DROP_SIMULATOR_P4_

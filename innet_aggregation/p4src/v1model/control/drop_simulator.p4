/*
 * Loss simulator (this kernel has no netem): each port may carry a drop
 * probability, drawn per aggregation packet with v1model's random extern.
 * Instantiated twice, as ingress_loss and egress_loss.
 */
#ifndef _DROP_SIMULATOR_P4_
#define _DROP_SIMULATOR_P4_

control DropSimulator(in port_t port, out bool drop) {
    drop_probability_t probability = 0;

    action set_drop_probability(drop_probability_t p) {
        probability = p;
    }

    table drop_probability {
        key = { port: exact @name("port"); }
        actions = { set_drop_probability; @defaultonly NoAction; }
        const default_action = NoAction();
        size = PORT_TABLE_SIZE;
    }

    apply {
        drop = false;
        if (drop_probability.apply().hit) {
            bit<32> draw;
            random(draw, 0, 0xFFFFFFFF);
            drop = draw < probability;
        }
    }
}

#endif  // _DROP_SIMULATOR_P4_

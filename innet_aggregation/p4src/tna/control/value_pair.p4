/*
 * Two of the sums, v(2p) and v(2p+1), in one register word indexed by (slot, set):
 * one stateful ALU in dual 32-bit mode (SwitchML's "processor"). ValueAggregator
 * instantiates VALUES_PER_PACKET/2 of them.
 *
 * Sums saturate at the int32 limits instead of wrapping (|+| on int<32>, the
 * stateful ALU's sadds), so an overflow is visible rather than wrong by 2^32, as on
 * v1model.
 *
 * A stateful ALU outputs one 32-bit word per packet. Pass 1 therefore puts the
 * updated high word (v(2p+1)) in the packet; a result takes pass 2 through the
 * recirculation port to read the low word (v(2p)). Contributions that are
 * consumed, the common case, take one pass. BitmapChecker's table tells pass 2
 * (`harvest`) from its ingress port.
 */
#ifndef _TNA_VALUE_PAIR_P4_
#define _TNA_VALUE_PAIR_P4_

control ValuePair(inout value_t lo,
                  inout value_t hi,
                  in cell_t cell,
                  in worker_id_t worker_id,
                  in worker_bitmap_t bitmap_before,
                  in bit<1> aggregate,
                  in bit<1> harvest,
                  in bit<1> release,
                  in bit<32> released,
                  in bit<32> age) {
    Register<value_pair_t, cell_t>(NUM_CELLS) sums;

    // The first contribution overwrites whatever an earlier round left.
    RegisterAction<value_pair_t, cell_t, int<32>>(sums) write_pair = {
        void apply(inout value_pair_t stored, out int<32> result) {
            stored.lo = (int<32>)lo;
            stored.hi = (int<32>)hi;
            result = stored.hi;
        }
    };

    RegisterAction<value_pair_t, cell_t, int<32>>(sums) add_pair = {
        void apply(inout value_pair_t stored, out int<32> result) {
            stored.lo = stored.lo |+| (int<32>)lo;
            stored.hi = stored.hi |+| (int<32>)hi;
            result = stored.hi;
        }
    };

    RegisterAction<value_pair_t, cell_t, int<32>>(sums) read_hi = {
        void apply(inout value_pair_t stored, out int<32> result) {
            result = stored.hi;
        }
    };

    RegisterAction<value_pair_t, cell_t, int<32>>(sums) read_lo = {
        void apply(inout value_pair_t stored, out int<32> result) {
            result = stored.lo;
        }
    };

    action write_values() {
        hi = (value_t)write_pair.execute(cell);
    }

    action add_values() {
        hi = (value_t)add_pair.execute(cell);
    }

    action read_values() {
        hi = (value_t)read_hi.execute(cell);
    }

    action harvest_values() {
        lo = (value_t)read_lo.execute(cell);
    }

    table register_op {
        key = {
            harvest:       ternary @name("harvest");
            aggregate:     ternary @name("aggregate");
            worker_id:     ternary @name("worker_id");
            bitmap_before: ternary @name("bitmap_before");
            release:       ternary @name("release");
            released[0:0]: ternary @name("released");
            age[3:0]:      ternary @name("age");
        }
        actions = { write_values; add_values; read_values; harvest_values; NoAction; }
        const entries = {
            // harvest aggregate worker_id bitmap_before release released age
            //                                             (first entry that matches wins)
            (1, _, _, _, _, _, _): harvest_values();         // pass 2 of a result
            (_, 0, _, _, _, _, _): NoAction();               // not a checked contribution
            (_, 1, _, _, _, _, AGE_STALE): NoAction();       // stale: its round is gone
            (_, 1, _, _, 1, _, _): read_values();            // a RELEASE
            (_, 1, _, _, _, 1, _): read_values();            // a released round
            (_, 1, _, 0, _, _, _): write_values();           // WRITE: first contribution
#define SEEN(w) (_, 1, w, SEEN_BIT(w), _, _, _): read_values();
            FOR_EACH_WORKER(SEEN)                            // READ: retransmission
#undef SEEN
            (_, 1, _, _, _, _, _): add_values();             // ADD: a further worker
        }
        const default_action = NoAction();
        size = 40;
    }

    apply {
        register_op.apply();
    }
}

#endif  // _TNA_VALUE_PAIR_P4_

"""An owner's sleepable memory put to sleep and woken from Python, without PyTorch (docs/sleep.md)."""
# [excerpt: round trip]
import custody
from custody import sleepable

with custody.owner("kv_cache"):                  # the owner these blocks are charged to
    cache = sleepable.alloc(64 << 20)            # an address (int) on device 0
sleepable.sleep(["kv_cache"])                    # device memory back, contents dropped (offload=[...] keeps them)
print(sleepable.owner_stats("kv_cache"))
sleepable.wake(["kv_cache"])                     # the same address; zeros
sleepable.free(cache, 64 << 20)
# [end excerpt]

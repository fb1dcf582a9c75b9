/// @file
/// `sleepable_memory`: device memory allocated for owners, each of which can give its physical
/// memory back to the device while it sleeps and take it again, at the same addresses, when it
/// wakes, with its contents kept (offloaded to host memory) or dropped (zeros after the wake).
///
/// Where its parts live:
///   sleep/sleep_policy.hpp            sleep_policy (discard, offload), owner_sleep
///   sleep/sleep_options.hpp           sleep_options (granule, peers)
///   sleep/sleep_statistics.hpp        sleep_statistics, owner_memory
///   sleep/sleep_error.hpp             sleep_error: what the owners' sleep forbids
///   sleep/detail/block_ledger.hpp     blocks, owners and totals, apart from mapping and locks
///   sleep/detail/block_range.hpp      one block's address range, mapped whole or not at all
///   sleep/detail/kept_bytes.hpp       what a discard keeps of a block for the layers above it
///   sleep/detail/stream_fence.hpp     the streams blocks were used on, and ordering after them
///   sleep/detail/sleep_plan.hpp       a sleep's or a wake's owners and blocks, checked up front
///   sleep/detail/sleep_steps.hpp      a sleep's and a wake's steps: contents out and back, memory
///                                     released and mapped again, each undone on failure
///   sleep/detail/contents_copies.hpp  host memory for contents, copies out and back: straight, or
///                                     through a staging ring
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/detail/mutex.hpp>
#include <custody/core/discarding.hpp>
#include <custody/core/error.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/core/properties.hpp>
#include <custody/core/statistics.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/platform/capture.hpp>
#include <custody/platform/platform.hpp>
#include <custody/platform/virtual_memory.hpp>
#include <custody/sleep/detail/block_ledger.hpp>
#include <custody/sleep/detail/block_range.hpp>
#include <custody/sleep/detail/contents_copies.hpp>
#include <custody/sleep/detail/kept_bytes.hpp>
#include <custody/sleep/detail/sleep_plan.hpp>
#include <custody/sleep/detail/sleep_steps.hpp>
#include <custody/sleep/detail/stream_fence.hpp>
#include <custody/sleep/sleep_error.hpp>
#include <custody/sleep/sleep_options.hpp>
#include <custody/sleep/sleep_policy.hpp>
#include <custody/sleep/sleep_statistics.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace custody::sleep {

/// Device memory of one device (`Vmm`: cuda::vmm on a GPU, host::vmm on the host platform) handed
/// out for owners, put to sleep and woken by owner: what an inference engine that shares its GPU
/// (generate, then train) or parks an idle model needs, with every pointer, tensor and captured
/// graph still valid after the wake.
///
/// Blocks. Each block is an address range of its own (its bytes rounded up to whole granules),
/// mapped with one physical allocation when it is allocated (detail::block_range: five driver calls
/// to sleep and wake a block of any size), and belongs to an owner: the calling
/// thread's owner scope (debug::owner_scope) or the owner given to allocate. A block records the
/// streams it is used on: the one it was allocated on, and those given to record().
///
/// Sleep. sleep({{"weights", offload}, {"kv_cache", discard}}) orders the resource's own stream
/// after the work enqueued so far on every stream those owners' blocks were allocated or recorded
/// on (one event each, no host-wide synchronization), copies the offloaded owners' contents to
/// host memory from `Backing` (straight, or through the staging ring when `Ring` is given), and
/// unmaps every block: the discarded ones once that work is done, each offloaded one once its copy
/// is, while the next copies run. The physical memory is the device's again (cudaMemGetInfo shows
/// it; on the host platform the process's resident memory drops); the address ranges stay
/// reserved. Wake maps every block again at the same address with the same access (the device and
/// its peers), each while the copies of the blocks before it run, copies offloaded contents back
/// byte for byte and fills discarded blocks with zeros, and returns when they are in place.
///
/// Layers above (core/discarding.hpp). A discard zeroes what the owner wrote and nothing of the
/// layers above it: bytes a layer keeps in a block (a tracker's guards, keep_through_discard) wake
/// as they were (detail/kept_bytes.hpp); is_resident says whether a block's bytes may be touched.
///
/// Rules: allocating for a sleeping owner, and sleeping an owner that sleeps, are
/// sleep_error(owner_asleep); waking an owner that does not sleep is sleep_error(owner_awake);
/// sleeping while a stream that the owners' blocks (or the caller's `after` streams) were used on
/// is capturing a graph is sleep_error(capture_open) (capture on other streams is neither seen nor
/// broken: the waits run in relaxed capture mode). Freeing a sleeping block is allowed (its
/// address range and offloaded contents go at once). Graphs captured over blocks keep working
/// after the wake (same addresses, same contents for offloaded owners); launching one while its
/// blocks sleep faults, as any kernel touching unmapped memory does. Owners are matched exactly
/// ("decoder/layer.3" is not part of "decoder"); an owner with no blocks can sleep (allocations for
/// it are refused until it wakes).
///
/// Failures. sleep and wake either complete or throw with the owners as they were (strong
/// guarantee): host memory taken for offload is given back, blocks a failed wake mapped are
/// unmapped; out of device or host memory is custody::out_of_memory, a driver failure its error.
/// Once the fence has passed, a sleep completes; three cases are reported through the failure
/// callback and counted in sleep_statistics (stuck_bytes) instead: a block that would not unmap
/// stays mapped (restored or zeroed at the wake); a block whose copy out cannot be waited for stays
/// mapped with its contents (kept as they are at the wake); and when the wait for a failed wake's
/// copies fails too, the blocks they may still be writing stay mapped rather than be unmapped under
/// them. A block whose access failed in a wake and whose unmap then failed too is mapped with its
/// access unknown: it is never copied into as it is; the next wake unmaps it and maps it anew, or,
/// while it will not unmap, refuses (custody::error) and changes nothing.
///
/// Stream semantics: allocate maps before it returns (usable on any stream); deallocate on a
/// stream waits for that stream and the block's recorded ones, then unmaps. sleep and wake block
/// the caller until their copies are done.
/// Thread safety: thread-safe, one mutex; sleep and wake hold it throughout, so other calls wait
/// for them (work enqueued on the blocks' streams must not call into the resource).
/// Ownership: owns `Backing` (constructed in place from the trailing constructor arguments), its
/// own stream, every block's range and memory; the ring, when given, is the caller's and must
/// outlive the resource. The streams blocks were used on must outlive the blocks or their sleep.
/// Destruction gives everything back, live blocks included.
/// Complexity: allocate and deallocate O(log n) in the n live blocks plus five or six driver
/// calls; sleep and wake O(n) plus five driver calls a block of the owners, plus the copies.
/// Alignment: up to the granule. Equality: identity.
template <virtual_memory_operations Vmm, class Backing, class Ring = void>
    requires stream_ordered_resource<Backing> && has_property<Backing, host_accessible> &&
             std::same_as<typename Backing::stream_type, typename Vmm::platform_type::stream_view>
class sleepable_memory final {
public:
    using platform_type = typename Vmm::platform_type;
    using stream_type = typename platform_type::stream_view;
    using backing_type = Backing;
    using range_type = detail::block_range<Vmm>;
    static constexpr const char* name = "sleepable_memory";
    /// Alignment of the host memory that holds offloaded contents.
    static constexpr std::size_t backup_alignment = detail::backup_alignment;

    /// Memory of `device`, offloaded straight into `Backing` memory (made from `backing_args`; pinned
    /// memory on the cuda platform). Throws std::invalid_argument for a device without virtual
    /// memory management, a granule that is not a power-of-two multiple of the device's, or a peer
    /// that does not exist.
    template <class... Args>
        requires std::is_void_v<Ring>
    explicit sleepable_memory(int device, sleep_options options = {}, Args&&... backing_args)
        : device_(device), granule_(detail::checked_granule<Vmm>(device, options.granule)),
          peers_(detail::checked_peers<Vmm>(device, options.peers)), backing_(std::forward<Args>(backing_args)...),
          stream_(device) {}

    /// As above, offloading through `ring` (which must outlive the resource), so that `Backing` may
    /// be pageable memory and the pinned memory used is the ring's alone.
    template <class R, class... Args>
        requires(!std::is_void_v<Ring> && std::same_as<R, Ring>)
    sleepable_memory(int device, R& ring, sleep_options options = {}, Args&&... backing_args)
        : device_(device), granule_(detail::checked_granule<Vmm>(device, options.granule)),
          peers_(detail::checked_peers<Vmm>(device, options.peers)), backing_(std::forward<Args>(backing_args)...),
          copies_(ring), stream_(device) {}

    sleepable_memory(const sleepable_memory&) = delete;
    sleepable_memory& operator=(const sleepable_memory&) = delete;

    /// Waits for its stream, then gives back every block (live or asleep), offloaded contents and
    /// withheld range.
    ~sleepable_memory() {
        static_cast<void>(run_exit_tolerant<platform_type>("sleepable_memory: waiting for its stream at destruction",
                                                           [&] { platform_type::synchronize(stream_); }));
        ledger_.for_each([&](block_type& b) {
            if (std::byte* backup = ledger_.detach_backup(b)) backing_.deallocate_sync(backup, b.bytes, backup_alignment);
        });
    }

    /// A block of `bytes` for the calling thread's owner (debug::current_owner()), mapped now.
    /// Throws sleep_error(owner_asleep) when that owner sleeps, custody::out_of_memory when the
    /// device has no address space or memory left; nothing changes then.
    [[nodiscard]] void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment) {
        return allocate(stream, bytes, alignment, debug::current_owner());
    }
    /// As above, for `owner` (debug::intern_owner("kv_cache"); nullptr: untagged).
    [[nodiscard]] void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment, debug::owner_id owner) {
        check_alignment(alignment, granule_);
        if (bytes == 0) return nullptr;
        const stream_use use{stream, platform_type::stream_device(stream)};
        std::lock_guard lock(mutex_);
        if (ledger_.asleep(owner)) {
            throw sleep_error(sleep_error::reason::owner_asleep, debug::owner_name(owner), "wake it before allocating for it");
        }
        block_type b = map_block(bytes, alignment, owner, use);
        void* ptr = b.base();
        ledger_.add(std::move(b)); // if it throws, b's range gives its memory back
        return ptr;
    }
    [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment) {
        return allocate(stream_type{}, bytes, alignment);
    }

    /// Gives the block at `ptr` back on `stream`: after the work enqueued on `stream` and on the
    /// streams recorded for it (waited for on the host, as cudaFree does), its memory goes to the
    /// device and its address range is freed. A sleeping block goes at once, with its offloaded
    /// contents. A block whose streams cannot be waited for stays mapped and withheld (reported).
    void deallocate(stream_type stream, void* ptr, std::size_t, std::size_t) noexcept {
        if (ptr == nullptr) return;
        const bool idle = wait_for_uses(stream, ptr);
        std::lock_guard lock(mutex_);
        free_block(ptr, idle);
    }
    void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        deallocate(stream_type{}, ptr, bytes, alignment);
    }

    /// Notes that work enqueued on `stream` uses the block at `ptr` (a live block's start): its
    /// sleep and its free wait for that work too. Throws std::invalid_argument for another pointer,
    /// std::bad_alloc; nothing is noted then.
    void record(void* ptr, stream_type stream) {
        if (ptr == nullptr) return;
        const stream_use use{stream, platform_type::stream_device(stream)};
        std::lock_guard lock(mutex_);
        block_type* b = ledger_.find(ptr);
        if (b == nullptr) throw std::invalid_argument("custody: sleepable_memory::record: not the start of a live block");
        if (std::find(b->uses.begin(), b->uses.end(), use) == b->uses.end()) b->uses.push_back(use);
    }

    /// Keeps [ptr, ptr + bytes), inside one live block, through a discard (see the class comment:
    /// what a layer above keeps there, such as a tracker's guards). Throws std::invalid_argument for
    /// a range outside every live block or a block that sleeps, std::bad_alloc; nothing is kept then.
    void keep_through_discard(const void* ptr, std::size_t bytes) {
        if (bytes == 0) return;
        std::lock_guard lock(mutex_);
        block_type* b = ledger_.containing(ptr);
        if (b == nullptr || ledger_.asleep(b->owner) || !detail::keep(b->kept, b->bytes, offset_in(*b, ptr), bytes)) {
            throw std::invalid_argument("custody: sleepable_memory::keep_through_discard: not inside an awake live block");
        }
    }
    /// Forgets what keep_through_discard(ptr, bytes) kept (once, if it did).
    void release_kept(const void* ptr, std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        if (block_type* b = ledger_.containing(ptr)) detail::release(b->kept, offset_in(*b, ptr), bytes);
    }
    /// Whether the block holding `ptr` has its memory now (awake, or stuck mapped while its owner
    /// sleeps): false for a sleeping block's address and for one outside every live block.
    [[nodiscard]] bool is_resident(const void* ptr) const noexcept {
        std::lock_guard lock(mutex_);
        const block_type* b = ledger_.containing(ptr);
        return b != nullptr && b->range->is_mapped();
    }

    /// Puts `owners` to sleep, each under its policy, after the work enqueued so far on their
    /// blocks' streams and on `after` (see the class comment). Throws sleep_error (an owner named
    /// asleep, a stream capturing), std::invalid_argument (an owner named twice),
    /// custody::out_of_memory (no host memory for the offload) or the platform's error; the owners
    /// are then as they were.
    void sleep(std::span<const owner_sleep> owners, std::span<const stream_type> after = {}) {
        basic_capture_mode_guard<platform_type> relaxed(capture_mode::relaxed);
        basic_device_guard<platform_type> on_device(device_); // the resource's stream is the device's
        std::lock_guard lock(mutex_);
        sleep_plan plan = detail::plan_sleep<platform_type>(ledger_, owners, after);
        std::vector<std::byte*> backups = detail::take_backups(backing_, plan.blocks, plan.policies, backup_alignment);
        try {
            steps_.save_contents(plan, backups);
            plan.marks.front().synchronize(); // the fence: nothing on the blocks' streams uses them now
        } catch (...) {
            steps_.undo_sleep(plan, backups);
            throw;
        }
        steps_.release_memory(plan, backups);
    }
    void sleep(std::initializer_list<owner_sleep> owners, std::span<const stream_type> after = {}) {
        sleep(std::span<const owner_sleep>(owners.begin(), owners.size()), after);
    }
    /// sleep() with one policy for every owner named.
    void sleep(std::initializer_list<std::string_view> owners, sleep_policy policy,
               std::span<const stream_type> after = {}) {
        std::vector<owner_sleep> list;
        list.reserve(owners.size());
        for (std::string_view o : owners) list.push_back({o, policy});
        sleep(std::span<const owner_sleep>(list), after);
    }

    /// Wakes `owners`: maps their blocks again, restores offloaded contents and zeroes discarded
    /// ones, and returns when they are in place. Throws sleep_error(owner_awake),
    /// std::invalid_argument (an owner named twice), custody::out_of_memory (the device has no
    /// memory for them) or the platform's error; the owners then still sleep, nothing it mapped is
    /// left mapped and their offloaded contents are kept.
    void wake(std::span<const std::string_view> owners) {
        basic_capture_mode_guard<platform_type> relaxed(capture_mode::relaxed);
        basic_device_guard<platform_type> on_device(device_);
        std::lock_guard lock(mutex_);
        wake_plan plan = detail::plan_wake(ledger_, owners);
        const std::size_t before = detail::mapped_bytes_of(plan.blocks);
        try {
            steps_.map_and_restore(plan);
        } catch (...) {
            steps_.undo_wake(plan);
            ledger_.remapped(before, detail::mapped_bytes_of(plan.blocks));
            throw;
        }
        steps_.finish_wake(plan, before);
    }
    void wake(std::initializer_list<std::string_view> owners) {
        wake(std::span<const std::string_view>(owners.begin(), owners.size()));
    }

    /// Lets `peer` read and write every block, live now, asleep (from its wake) or allocated later.
    /// Throws std::invalid_argument for a device that does not exist, or the platform's error
    /// (blocks granted before the failure keep the access; later blocks do not get it).
    void grant_access(int peer) {
        std::lock_guard lock(mutex_);
        if (peer == device_ || std::find(peers_.begin(), peers_.end(), peer) != peers_.end()) return;
        if (!Vmm::supported(peer)) throw std::invalid_argument("custody: peer device " + std::to_string(peer) + " does not exist");
        peers_.reserve(peers_.size() + 1);
        ledger_.for_each([&](block_type& b) { b.range->grant_access(peer); });
        peers_.push_back(peer);
    }

    [[nodiscard]] resource_statistics statistics() const {
        std::lock_guard lock(mutex_);
        return ledger_.statistics();
    }
    /// Owners asleep, bytes released and offloaded, what would not unmap (see sleep_statistics).
    [[nodiscard]] sleep_statistics detailed_statistics() const {
        std::lock_guard lock(mutex_);
        sleep_statistics s = ledger_.sleep_totals();
        s.granule = granule_;
        return s;
    }
    /// `owner`'s blocks and state now (all zero for an owner never seen).
    [[nodiscard]] owner_memory owner_statistics(std::string_view owner) const {
        const debug::owner_id id = debug::intern_owner(owner);
        std::lock_guard lock(mutex_);
        return ledger_.owner_totals(id);
    }
    [[nodiscard]] bool is_asleep(std::string_view owner) const {
        const debug::owner_id id = debug::intern_owner(owner);
        std::lock_guard lock(mutex_);
        return ledger_.asleep(id);
    }

    [[nodiscard]] int device() const noexcept { return device_; }
    [[nodiscard]] std::size_t granularity() const noexcept { return granule_; }
    [[nodiscard]] Backing& backing() noexcept { return backing_; }

    friend bool operator==(const sleepable_memory& a, const sleepable_memory& b) noexcept { return &a == &b; }
    friend void get_property(const sleepable_memory&, device_accessible) noexcept {}
    friend void get_property(const sleepable_memory&, discards_contents) noexcept {}
    friend void get_property(const sleepable_memory&, host_accessible) noexcept
        requires(platform_type::name == std::string_view("host"))
    {}

private:
    using stream_use = detail::stream_use<stream_type>;
    using block_type = detail::block<range_type, stream_type>;
    using copies_type = std::conditional_t<std::is_void_v<Ring>, detail::direct_copies<platform_type>,
                                           detail::ring_copies<std::conditional_t<std::is_void_v<Ring>, int, Ring>>>;

    using sleep_plan = detail::sleep_plan<platform_type, block_type>;
    using wake_plan = detail::wake_plan<block_type>;

    // ---- allocate and deallocate ----

    [[nodiscard]] static std::size_t offset_in(const block_type& b, const void* ptr) noexcept {
        return static_cast<std::size_t>(static_cast<const std::byte*>(ptr) - b.base());
    }

    /// A new block of `bytes`, reserved and mapped whole with the device's and the peers' access.
    block_type map_block(std::size_t bytes, std::size_t alignment, debug::owner_id owner, const stream_use& use) {
        if (align_up_overflows(bytes, granule_)) {
            throw out_of_memory(bytes, alignment, device_, ledger_.statistics(), name, "larger than the address space");
        }
        block_type b;
        b.bytes = bytes;
        b.owner = owner;
        b.uses.push_back(use);
        std::vector<int> access{device_};
        access.insert(access.end(), peers_.begin(), peers_.end());
        b.range = std::make_unique<range_type>(device_, align_up(bytes, granule_), granule_, std::move(access));
        if (!b.range->map()) {
            throw out_of_memory(bytes, alignment, device_, ledger_.statistics(), name,
                                "the device has no physical memory for " + std::to_string(b.span()) + " bytes");
        }
        return b;
    }

    /// Waits for `stream` and the streams recorded for the awake block at `ptr`; false when a wait
    /// failed (reported). A sleeping block waits only for the resource's stream (its sleep waited
    /// for the others; a failed wake's copies may still run there).
    bool wait_for_uses(stream_type stream, void* ptr) noexcept {
        std::vector<stream_type> streams;
        const bool listed = run_exit_tolerant<platform_type>("sleepable_memory: listing a freed block's streams", [&] {
            std::lock_guard lock(mutex_);
            streams = ledger_.streams_before_free(ptr, stream, stream_);
        });
        if (!listed) return false;
        return run_exit_tolerant<platform_type>("sleepable_memory: waiting for the streams of a freed block", [&] {
            for (const stream_type s : streams) platform_type::synchronize(s);
        });
    }

    /// Gives the block at `ptr` back: its offloaded contents, its memory (when `idle`: nothing
    /// may still use it) and its range. Caller holds mutex_.
    void free_block(void* ptr, bool idle) noexcept {
        block_type* found = ledger_.find(ptr);
        if (found == nullptr) {
            report_noexcept_failure("sleepable_memory::deallocate", "a pointer that is not a live block's start");
            return;
        }
        if (std::byte* backup = ledger_.detach_backup(*found)) backing_.deallocate_sync(backup, found->bytes, backup_alignment);
        block_type b = ledger_.take(ptr);
        const std::size_t before = b.range->mapped_bytes();
        if (idle && b.range->unmap()) {
            ledger_.remapped(before, 0);
            return; // b's range frees its address space
        }
        ledger_.remapped(before, b.range->mapped_bytes());
        ledger_.withhold(std::move(b.range));
    }

    int device_;
    std::size_t granule_;                 ///< a power-of-two multiple of Vmm::granularity(device_)
    std::vector<int> peers_;              ///< guarded by mutex_; distinct, never device_
    Backing backing_;
    [[no_unique_address]] copies_type copies_;
    typename platform_type::stream stream_; ///< the copies of sleeps and wakes; only they enqueue on it
    mutable custody::detail::mutex mutex_;
    detail::block_ledger<range_type, stream_type> ledger_; ///< guarded by mutex_
    /// The steps of a sleep and a wake, over the parts above; used under mutex_.
    detail::sleep_steps<platform_type, block_type, detail::block_ledger<range_type, stream_type>, Backing, copies_type>
        steps_{device_, granule_, stream_, backing_, copies_, ledger_};
};

} // namespace custody::sleep

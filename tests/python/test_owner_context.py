"""custody.owner() follows Python's context (contextvars): threads, asyncio tasks and generators
each see their own owner; a scope left on another thread, or by an interleaved task, never leaves a
thread inside it for good. Host build with tracking on, in fresh processes."""
import pytest

from conftest import run_python


@pytest.fixture(autouse=True)
def _host_only(host_lib):
    pass


def test_asyncio_tasks_each_see_their_own_owner_and_charge_it():
    run_python("""
        import asyncio, custody
        custody.configure_tracking()
        lib = custody.library()
        kept = []

        async def worker(name, first, second):
            with custody.owner(name):
                await first.wait()
                assert custody.current_owner() == name, (name, custody.current_owner())
                kept.append(lib.alloc(1 << 20, 0))   # charged to this task's owner
                second.set()
                await asyncio.sleep(0)
                assert custody.current_owner() == name
            assert custody.current_owner() == "<untagged>"

        async def main():
            a, b, c = asyncio.Event(), asyncio.Event(), asyncio.Event()
            ta = asyncio.create_task(worker("task_a", a, b))
            tb = asyncio.create_task(worker("task_b", b, c))
            await asyncio.sleep(0)                   # both inside their scopes now
            a.set()
            await asyncio.gather(ta, tb)

        asyncio.run(main())
        assert custody.current_owner() == "<untagged>"
        assert lib.owner_current() == "<untagged>", lib.owner_current()
        s = custody.snapshot()
        assert s.live_bytes("task_a") == 1 << 20 and s.live_bytes("task_b") == 1 << 20, s.owners
        assert "task_a/task_b" not in s.owners and "task_b/task_a" not in s.owners, s.owners
    """)


def test_a_generator_resumed_on_another_thread_leaves_no_thread_inside_its_scope():
    run_python("""
        import threading, custody
        custody.configure_tracking()
        lib = custody.library()

        def produce():
            with custody.owner("gen"):
                yield custody.current_owner()
                yield custody.current_owner()

        g = produce()
        assert next(g) == "gen"
        result = []

        def finish():
            result.append(custody.current_owner())
            result.extend(g)                          # resumed and closed on this thread
            result.append(custody.current_owner())
            result.append(lib.owner_current())

        t = threading.Thread(target=finish)
        t.start(); t.join()
        assert result[0] == "<untagged>" and result[-2:] == ["<untagged>", "<untagged>"], result
        assert custody.current_owner() == "<untagged>", custody.current_owner()
        block = lib.alloc(4096, 0)                    # this thread is no longer inside "gen"
        assert custody.snapshot().live_bytes("gen") == 0, custody.snapshot().owners
        assert lib.owner_current() == "<untagged>", lib.owner_current()
    """)


def test_threads_start_outside_every_scope_and_nest_on_their_own():
    run_python("""
        import threading, custody
        custody.configure_tracking()
        seen = {}
        barrier = threading.Barrier(4)

        def run(i):
            assert custody.current_owner() == "<untagged>"
            with custody.owner("t%d" % i):
                barrier.wait()
                with custody.owner("inner"):
                    barrier.wait()
                    seen[i] = custody.current_owner()
            seen[i, "after"] = custody.current_owner()

        with custody.owner("main"):
            threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
            for t in threads: t.start()
            for t in threads: t.join()
            assert custody.current_owner() == "main"
        assert all(seen[i] == "t%d/inner" % i for i in range(4)), seen
        assert all(seen[i, "after"] == "<untagged>" for i in range(4)), seen
    """)


def test_sleepable_memory_goes_to_the_task_that_allocates_it():
    run_python("""
        import asyncio, custody
        from custody import sleepable
        lib = custody.library()
        blocks = []

        async def worker(name, first, second):
            with custody.owner(name):
                await first.wait()
                blocks.append(sleepable.alloc(1 << 20, lib=lib))
                second.set()

        async def main():
            a, b, c = asyncio.Event(), asyncio.Event(), asyncio.Event()
            ta = asyncio.create_task(worker("sleep_a", a, b))
            tb = asyncio.create_task(worker("sleep_b", b, c))
            await asyncio.sleep(0)
            a.set()
            await asyncio.gather(ta, tb)

        asyncio.run(main())
        assert sleepable.owner_stats("sleep_a", lib=lib)["bytes"] == 1 << 20, sleepable.owner_stats("sleep_a", lib=lib)
        assert sleepable.owner_stats("sleep_b", lib=lib)["bytes"] == 1 << 20
    """)


def test_the_librarys_push_and_pop_are_scopes_of_the_context_one_current_owner():
    """library().owner_push is for code that cannot use a `with` block: it opens a scope of the
    context, so custody.current_owner(), the library's owner and what an allocation is charged to
    agree, and custody.owner() scopes nest inside it."""
    run_python("""
        import custody
        custody.configure_tracking()
        lib = custody.library()
        lib.owner_push("decode")
        assert custody.current_owner() == "decode", custody.current_owner()
        assert lib.owner_current() == "decode", lib.owner_current()
        a = lib.alloc(4096, 0)
        with custody.owner("kv_cache"):
            assert custody.current_owner() == "decode/kv_cache"
            b = lib.alloc(8192, 0)
        lib.owner_push("step")
        assert custody.current_owner() == "decode/step"
        lib.owner_pop()
        lib.owner_pop()
        assert custody.current_owner() == "<untagged>" and lib.owner_current() == "<untagged>"
        s = custody.snapshot()
        assert s.live_bytes("decode") == 4096 and s.live_bytes("decode/kv_cache") == 8192, s.owners
        try:
            lib.owner_pop()
        except custody.CustodyError as e:
            assert "without an owner scope" in str(e)
        else:
            raise AssertionError("an unbalanced pop was accepted")
        lib.free(a, 4096, 0); lib.free(b, 8192, 0)
    """)

"""envd directory watches: the SDK's `files.watch_dir`, polling (sync SDK) and streaming
(async SDK), with E2B's event names."""

import asyncio

from e2b import AsyncSandbox, FilesystemEventType

from conftest import wait_for


def test_sync_watch_dir_reports_create_write_chmod_rename_remove(sandbox, unique):
    root = f"/home/user/watch-{unique}"
    sandbox.files.make_dir(root)
    handle = sandbox.files.watch_dir(root)
    sandbox.commands.run(f"cd {root} && echo a > f && chmod 600 f && mv f g && rm g")
    seen = []

    def all_in():
        seen.extend((e.name, e.type) for e in handle.get_new_events())
        return len(seen) >= 6

    wait_for(all_in, "six watch events")
    assert seen == [
        ("f", FilesystemEventType.CREATE),
        ("f", FilesystemEventType.WRITE),
        ("f", FilesystemEventType.CHMOD),
        ("f", FilesystemEventType.RENAME),
        ("g", FilesystemEventType.CREATE),
        ("g", FilesystemEventType.REMOVE),
    ]
    handle.stop()


def test_sync_watch_dir_recursive_sees_subdirectories(sandbox, unique):
    root = f"/home/user/rwatch-{unique}"
    sandbox.files.make_dir(f"{root}/sub")
    handle = sandbox.files.watch_dir(root, recursive=True)
    sandbox.files.write(f"{root}/sub/deep.txt", "x")
    seen = []

    def deep_written():
        seen.extend((e.name, e.type) for e in handle.get_new_events())
        return ("sub/deep.txt", FilesystemEventType.WRITE) in seen

    wait_for(deep_written, "a write event for sub/deep.txt")
    assert ("sub/deep.txt", FilesystemEventType.CREATE) in seen
    handle.stop()


def test_async_watch_dir_streams_events(sandbox, unique):
    root = f"/home/user/awatch-{unique}"
    sandbox.files.make_dir(root)

    async def scenario():
        sbx = await AsyncSandbox.connect(sandbox.sandbox_id)
        events = []
        handle = await sbx.files.watch_dir(root, on_event=events.append, timeout=0)
        await sbx.files.write(f"{root}/note.txt", "hello")
        for _ in range(400):
            if any(e.name == "note.txt" and e.type == FilesystemEventType.WRITE for e in events):
                break
            await asyncio.sleep(0.025)
        await handle.stop()
        return [(e.name, e.type) for e in events]

    seen = asyncio.run(scenario())
    assert ("note.txt", FilesystemEventType.CREATE) in seen
    assert ("note.txt", FilesystemEventType.WRITE) in seen

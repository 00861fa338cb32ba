"""The sync transport's portal loop (``hedgerow.client._portal``): closed at exit, nothing left."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_the_portal_loop_is_closed_at_exit_with_its_tasks_wound_down() -> None:
    # A task left running on the portal (as a background exporter or a poller would be) and the
    # loop itself: at interpreter exit both are wound down, so a strict app sees no warning.
    script = textwrap.dedent(
        """
        import asyncio
        from hedgerow.client._portal import PORTAL

        async def leave_a_task():
            asyncio.get_running_loop().create_task(asyncio.sleep(3600), name="left-behind")
            return "ok"

        print(PORTAL.run(leave_a_task()))
        """
    )
    done = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "error::ResourceWarning", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert "ResourceWarning" not in done.stderr, done.stderr
    assert "unclosed event loop" not in done.stderr, done.stderr
    assert "Task was destroyed" not in done.stderr, done.stderr

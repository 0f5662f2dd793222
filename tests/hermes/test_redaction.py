"""Contract X4 on the Python side: E2B keys, bearer tokens and credential URLs planted in log
arguments, in Rust `tracing` events and in settings quoted by doctor rows never reach a
``hermes_e2b`` log record or a doctor row (the rules are the native core's, used once)."""

from __future__ import annotations

CASES = 64


def test_planted_secrets_reach_no_log_record_and_no_doctor_row(home):
    result = home.driver(
        f"""
        import json, logging, random
        import hermes_e2b
        from hermes_e2b import _native
        from hermes_e2b.provider import E2BProvider

        rng = random.Random(10)
        alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
        def word(n): return "".join(rng.choice(alnum) for _ in range(n))

        records = []
        class H(logging.Handler):
            def emit(self, r): records.append(self.format(r))
        logger = logging.getLogger("hermes_e2b"); logger.addHandler(H()); logger.setLevel(logging.DEBUG)

        class Ctx:
            def __init__(self, settings): self.settings = settings
            def get_config(self, key, default=None): return self.settings.get(key, default)

        leaks, rows_seen, redacted_rows, cases = [], 0, 0, 0
        for _ in range({CASES}):
            cases += 1
            key = "".join(rng.choice("0123456789abcdef") for _ in range(40))
            token, user, password = "Tk" + word(20), "u" + word(10), "P" + word(14)
            secrets = [key, token, user, password]
            url = f"https://{{user}}:{{password}}@files.example.com/a"
            text = f"key e2b_{{key}} auth Bearer {{token}} url {{url}}"
            records.clear()
            logger.warning("hermes-e2b: %s", text)
            logger.error(text)
            try:
                raise RuntimeError(text)
            except RuntimeError:
                logger.exception("failed")
            _native.emit_log("warn", text)
            logs = list(records)
            rows = []
            for settings in ({{"api_url": url}}, {{"sandbox_url": url}}, {{"template": text}},
                             {{"lease_seconds": text}}, {{"metadata": text}}):
                rows += E2BProvider(Ctx(settings)).doctor_checks()
            rows_seen += len(rows)
            redacted_rows += sum("[REDACTED]" in "".join(r[1:]) for r in rows)
            for out in logs + ["|".join(map(str, r)) for r in rows]:
                leaks += [(s, out) for s in secrets if s in out]
            assert len(logs) == 4, logs
            assert all("[REDACTED]" in line for line in logs), logs
        print("RESULT:" + json.dumps({{"cases": cases, "leaks": leaks[:3], "rows": rows_seen,
                                      "redacted_rows": redacted_rows}}))
        """
    )
    print(f"X4 Python redaction: {result['cases']} cases, {result['rows']} doctor rows checked")
    assert result["cases"] == CASES
    assert result["leaks"] == []
    assert result["redacted_rows"] > 0, "no planted text reached a doctor row: nothing was tested"

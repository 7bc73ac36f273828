"""Judging results: the baseline and its repeats, each experiment's screen run, confirmation
pairs and verdict, re-runs of best (drift), and `verify`. A mixin of the Loop: it uses the
loop's store, config, display, stop event and best moves."""
from __future__ import annotations

import math
import socket
import statistics
import time

from . import verify as verify_mod
from .errors import GitresearchError
from .confirm import Floor, best_reference, gain, min_delta_rule, pooled_noise, slow_run, sprt
from .history import current_floor
from .reward import reward
from .sandbox import SandboxError, mode as sandbox_mode
from .trial import result_fields, run_commit, throughput


class LoopError(GitresearchError):
    """The loop cannot go on (a failed baseline or setup, no sandbox, a second loop)."""


class Judge:
    # -- baseline and noise floor --------------------------------------------------------------

    def ensure_baseline(self) -> dict | None:
        """The baseline's record; runs it (noise_runs times) when best's root has no note."""
        root = self.store.experiment_commit(0)
        if root is None:
            root = self.store.best()
            self.store.set_baseline(root)
            if self.remote and not self.remote.reserve(0, root):  # another machine set it first
                self.remote.sync()
                root = self.store.experiment_commit(0)
        record = self.store.read_note(root)
        if record is not None:
            return record
        noise = self.config.noise
        runs, slow, kept_dirs = [], [], []
        while len(runs) < max(1, noise.noise_runs):
            index = len(runs) + len(slow)
            self.display(f"baseline run {len(runs) + 1}/{max(1, noise.noise_runs)}")
            result = run_commit(self.store, self.config, root, self.run_dir(0) / f"noise-{index}",
                                self._progress(0), self.stop_event)
            if self.stop_event.is_set():
                return None
            if result.status != "ok":
                raise LoopError(f"the baseline failed ({result.status}): {result.reason}\n"
                                f"log: {result.log_path}\n{result.log_tail}")
            runs.append(result)
            kept_dirs.append(index)
            if len(runs) == max(1, noise.noise_runs) and len(slow) < noise.max_outlier_reruns:
                rates = [throughput(r)["steps_per_s"] for r in runs]
                slowest = min(range(len(runs)), key=lambda i: rates[i] or 0)
                others = rates[:slowest] + rates[slowest + 1:]
                if slow_run(rates[slowest], others, noise.outlier_share):
                    # the machine was loaded: that run measures the load, not the noise
                    slow.append({"value": runs[slowest].metric, "run": kept_dirs.pop(slowest),
                                 **throughput(runs.pop(slowest))})
                    self.display(f"baseline run at {rates[slowest]:.3f} steps/s is below "
                                 f"{noise.outlier_share:g} x its peers': running it again")
        values = [r.metric for r in runs]
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        min_delta, rule = min_delta_rule(pooled_noise([values], noise.confidence), noise.k_sigma,
                                         noise.min_delta, noise.min_delta_floor)
        record = {"experiment": 0, "status": "baseline", "policy": "baseline",
                  **result_fields(runs[-1], self.store, self.config.metric.name),
                  "val_bpb": statistics.mean(values), "noise_runs": values, "noise_std": std,
                  "noise_throughput": [throughput(r) for r in runs], "noise_slow": slow,
                  "noise_run_dirs": kept_dirs,
                  "min_delta": min_delta, "min_delta_rule": rule, "budget_s": self.config.run.budget_s,
                  "host": socket.gethostname(), "finished": time.time()}
        self.store.write_note(root, record)
        if self.remote:
            self.remote.publish_notes()
        self.display(f"baseline: {self.config.metric.name} {record['val_bpb']:.6f} (std {std:.6f} over "
                     f"{len(values)} runs), min_delta {min_delta:.6f}")
        return record

    def verify(self, revs: tuple[str, ...] = (), chain: bool = False, runs: int = 3) -> list[dict]:
        """`gitresearch verify`: each commit (default: best's chain) re-run `runs` times in
        pairs with its parent; the verification records, newest last."""
        with self.holding_repo():
            try:
                sandbox_mode(self.config)
            except SandboxError as err:
                raise LoopError(str(err)) from err
            self.setup()
            sigma = self.noise_floor().sigma
            done, ran = [], []
            targets = verify_mod.targets(self.store, revs, chain)
            total = len(targets) * runs * 2
            self.on_count(0, total, "verification runs")
            for commit, parent in targets:
                self.display(f"verifying {commit[:12]} {self.store.subject(commit)} against {parent[:12]}")

                def run(rev, name, commit=commit):
                    folder = self.store.state_dir / "runs" / "verify" / f"{commit[:12]}-{name}"
                    result = run_commit(self.store, self.config, rev, folder, self._progress(0),
                                        self.stop_event, env_extra=self.env_extra)
                    ran.append(name)
                    self.on_count(len(ran), total, "verification runs")
                    return result
                entry = verify_mod.verify_one(self.store, self.config, commit, parent, runs, run, sigma,
                                              self.stop_event)
                if entry is None:
                    break
                done.append({"commit": commit, "description": self.store.subject(commit), **entry})
                self.display(f"{commit[:12]}: {entry['verdict']}")
            return done

    def noise_floor(self) -> Floor:
        return current_floor(self.store, self.config, [e.record for e in self.store.experiments() if e.record])

    # -- best re-measured ----------------------------------------------------------------------

    def remeasure_due(self, experiments) -> bool:
        cfg = self.config.confirm
        record = self.store.read_note(self.store.best()) or {}
        if not record or self.worker != 0:  # one worker re-measures for all
            return False
        runs = record.get("remeasured") or []
        newest = experiments[0].number if experiments else 0
        since = newest - max([record.get("experiment") or 0] + [r.get("after", 0) for r in runs])
        last = max([record.get("finished") or 0] + [r.get("finished", 0) for r in runs])
        return bool((cfg.remeasure_every and since >= cfg.remeasure_every)
                    or (cfg.remeasure_hours and time.time() - last >= cfg.remeasure_hours * 3600))

    def remeasure(self, experiments) -> dict | None:
        """Re-run best once; a value outside its band or a throughput change marks drift,
        which `status` and the prompts report and which makes the screen compare candidates
        with this fresh run. The run is appended to best's note."""
        cfg = self.config.confirm
        best = self.store.best()
        record = self.store.read_note(best) or {}
        runs = record.setdefault("remeasured", [])
        number = record.get("experiment") or 0
        self.display(f"re-measuring best (#{number})")
        result = run_commit(self.store, self.config, best, self.run_dir(number) / f"remeasure-{len(runs)}",
                            self._progress(number), self.stop_event, env_extra=self.env_extra)
        if self.stop_event.is_set():
            return None
        after = experiments[0].number if experiments else 0
        entry = {"value": result.metric, "status": result.status, "after": after, "finished": time.time(),
                 **throughput(result)}
        if result.status != "ok":
            entry.update(outlier=True, drift=False, reason=f"re-run ended {result.status}: {result.reason}")
        else:
            level = self.noise_floor()
            band = cfg.drift_sigma * math.sqrt(2) * level.sigma
            rates = self.best_rates(record)
            rate = entry["steps_per_s"]
            change = rate / statistics.median(rates) - 1 if rate and rates else 0.0
            reasons = []
            if abs(result.metric - record["val_bpb"]) > band:
                reasons.append(f"value {result.metric:.6f} is {result.metric - record['val_bpb']:+.6f} from "
                               f"best's {record['val_bpb']:.6f} (band ±{band:.6f})")
            if abs(change) > cfg.drift_throughput:
                reasons.append(f"steps/s {change:+.0%} from best's runs")
            entry.update(drift=bool(reasons), reason="; ".join(reasons) or "within its band",
                         outlier=slow_run(rate, rates, self.config.noise.outlier_share))
        runs.append(entry)
        self.store.write_note(best, record)
        if self.remote:
            self.remote.publish_notes()
        self.display(f"best re-measured: {entry['reason']}" + (" (DRIFT)" if entry["drift"] else ""))
        return entry

    # -- one experiment: screen, confirm, conclude ----------------------------------------------

    def run_experiment(self, number, commit, parent, description, data, record=None) -> dict | None:
        """Screen run, then (when it passes the screen) confirmation pairs, then the verdict;
        `record`: a note left in `confirming` by an interrupted loop, resumed where it was.
        None when interrupted (what was measured is in the note)."""
        if record is None:
            record = self.screen(number, commit, parent, description, data)
            if record is None:
                return None
        if record["status"] == "confirming":
            record = self.confirm(number, commit, parent, record)
            if record is None:
                return None
        return self.conclude(number, commit, parent, description, record)

    def screen(self, number, commit, parent, description, data) -> dict | None:
        self.display(f"#{number} {description}")
        started = time.time()
        monitor = self.early_stop.monitor(self.noise_floor().sigma)
        result = run_commit(self.store, self.config, commit, self.run_dir(number),
                            self._progress(number), self.stop_event,
                            should_stop=monitor.update if monitor else None, env_extra=self.env_extra)
        if self.stop_event.is_set() and result.status != "ok":
            return None  # no note: the next loop runs it again
        parent_record = self.store.read_note(parent) or {}
        best = self.store.best()
        best_record = self.store.read_note(best) or {}
        level = self.noise_floor()
        record = {"experiment": number, "description": description, "started": started,
                  "finished": time.time(), "budget_s": self.config.run.budget_s,
                  "host": socket.gethostname(), "parent_val_bpb": parent_record.get("val_bpb"),
                  **level.fields(), **data, **result_fields(result, self.store, self.config.metric.name)}
        if result.metric is not None and parent_record.get("val_bpb") is not None:
            record["delta"] = result.metric - parent_record["val_bpb"]
        if monitor is not None:
            record["comment"] = monitor.comment
            record["checks"] = [{k: (round(v, 6) if isinstance(v, float) else v)
                                 for k, v in vars(c).items()} for c in monitor.checks]
            record["early_stop_source"] = monitor.source
            idle, lasting = monitor.idle(bool(result.curve))
            if idle:
                record["early_stop_idle"] = idle
                if lasting and not self.said_idle:
                    self.said_idle = True  # once per loop
                    self.display(f"early stop cannot act: {idle}")
        reference, source = best_reference(best_record)
        if result.status != "ok":
            record["status"] = result.status
        elif parent != best or reference is None:
            record["status"] = "discard"
            record["reason"] = "best moved since it was proposed"
            parent_value = parent_record.get("val_bpb")
            if parent_value is not None and gain(result.metric, parent_value) >= level.screen:
                record["rebase"] = True  # it passed the screen against its parent: run it again on best
        elif not self.config.confirm.enabled:  # the single-run rule
            won = gain(result.metric, reference) > level.min_delta
            record["status"] = "keep" if won else "discard"
            if not won:
                record["reason"] = f"not better than {source} by more than min_delta {level.min_delta:.6f}"
        elif gain(result.metric, reference) >= level.screen:
            cfg = self.config.confirm
            record["status"] = "confirming"
            record["confirmation"] = {"reference": reference, "reference_source": source,
                                      "screen_gain": gain(result.metric, reference),
                                      "delta": level.min_delta, "sigma": level.sigma,
                                      "alpha": cfg.alpha, "beta": cfg.beta, "max_pairs": cfg.max_pairs,
                                      "pairs": [], "slow": []}
            self.store.write_note(commit, record)  # a kill from here on resumes the pairs
        else:
            record["status"] = "discard"
            record["reason"] = (f"screen: gain {gain(result.metric, reference):+.6f} over "
                                f"{source} below {level.screen:.6f} ({self.config.confirm.screen_sigma:g} "
                                f"x noise std {level.sigma:.6f})")
        return record

    def confirm(self, number, commit, parent, record) -> dict | None:
        """Pairs of fresh runs (candidate, best; order alternating) until the sequential test
        decides. Each pair is in the note before the next starts: a kill loses at most the
        pair that was running, and never repeats a recorded one."""
        conf = record["confirmation"]
        parent_record = self.store.read_note(parent) or {}
        while True:
            verdict = sprt([p["gain"] for p in conf["pairs"]], conf["delta"], conf["sigma"],
                           conf["alpha"], conf["beta"], conf["max_pairs"])
            conf.update(verdict=verdict.text, llr=round(verdict.llr, 4))
            if verdict.decision != "continue":
                break
            index = len(conf["pairs"]) + len(conf["slow"]) + 1
            order = ("candidate", "best") if len(conf["pairs"]) % 2 == 0 else ("best", "candidate")
            self.display(f"#{number} confirming: pair {len(conf['pairs']) + 1} ({verdict.text})")
            runs = {}
            for role in order:
                result = run_commit(self.store, self.config, commit if role == "candidate" else parent,
                                    self.run_dir(number) / f"confirm-{index}-{role}",
                                    self._progress(number), self.stop_event, env_extra=self.env_extra)
                if self.stop_event.is_set():
                    return None
                if result.status != "ok":
                    who = "the candidate" if role == "candidate" else "best"
                    record.update(status="discard", reason=f"confirmation: {who}'s re-run {index} "
                                  f"ended {result.status}: {result.reason}")
                    return record
                runs[role] = result
            pair = {"candidate": runs["candidate"].metric, "best": runs["best"].metric,
                    "gain": gain(runs["candidate"].metric, runs["best"].metric),
                    "order": list(order), "finished": time.time(),
                    "steps_per_s": {role: throughput(r)["steps_per_s"] for role, r in runs.items()}}
            peers = {"candidate": [record.get("throughput", {}).get("steps_per_s")]
                     + [p["steps_per_s"]["candidate"] for p in conf["pairs"]],
                     "best": self.best_rates(parent_record) + [p["steps_per_s"]["best"] for p in conf["pairs"]]}
            slow = [role for role in order if slow_run(pair["steps_per_s"][role], peers[role],
                                                       self.config.noise.outlier_share)]
            if slow and len(conf["slow"]) < self.config.noise.max_outlier_reruns:
                conf["slow"].append(dict(pair, slow=slow))  # a loaded machine: run the pair again
                self.display(f"#{number} pair {index}: {', '.join(slow)} ran slow; running it again")
            else:
                conf["pairs"].append(pair)
            self.store.write_note(commit, record)
        values = [p["candidate"] for p in conf["pairs"]]
        record["screen_val_bpb"] = record["val_bpb"]
        if values:  # the screen run was selected for looking good: the fresh runs are the value
            record["val_bpb"] = statistics.fmean(values)
            if record.get("parent_val_bpb") is not None:
                record["delta"] = record["val_bpb"] - record["parent_val_bpb"]
        record["status"] = verdict.decision
        if verdict.decision == "discard":
            record["reason"] = f"confirmation: {verdict.text}"
        return record

    @staticmethod
    def best_rates(record: dict) -> list:
        """Steps per second of runs of a best commit already on record (its peers)."""
        rates = [t.get("steps_per_s") for t in record.get("noise_throughput") or []]
        rates.append((record.get("throughput") or {}).get("steps_per_s"))
        rates += [r.get("steps_per_s") for r in record.get("remeasured") or []]
        return [r for r in rates if r]

    def conclude(self, number, commit, parent, description, record) -> dict:
        """Write the verdict, move best on a keep, rebase a gain that best's move overtook."""
        baseline = self.baseline_record()
        best = self.store.best()
        record["reward"] = reward(record, baseline, self.config.reward)
        rebase = record.pop("rebase", False)
        self.store.write_note(commit, record)
        if record["status"] == "keep":
            verdict = (record.get("confirmation") or {}).get("verdict", "")
            message = f"gitresearch: keep #{number} {self.config.metric.name} {record['val_bpb']:.6f}: {description}"
            if best != parent or not self.advance(best, commit, message + (f"\n\n{verdict}" if verdict else "")):
                record.update(status="discard", reason="best moved while it ran")
                record["reward"] = reward(record, baseline, self.config.reward)
                rebase = True
        if rebase and record["status"] == "discard" and parent != self.store.best():
            # an improvement found against an older best: rebased and run again, never dropped
            record["reason"] += "; " + self.rebase(number, commit, description)
            self.store.write_note(commit, record)
        elif record["status"] == "discard" and record["reason"] == "best moved while it ran":
            self.store.write_note(commit, record)
        if self.remote:
            self.remote.publish_notes()
        value = record.get("val_bpb")
        shown = f"{value:.6f}" if value is not None else "-"
        verdict = (record.get("confirmation") or {}).get("verdict") if record["status"] == "keep" else ""
        self.display(f"#{number} {record['status']}: {self.config.metric.name} {shown} "
                     f"{verdict or record.get('reason', '')}".rstrip())
        return record

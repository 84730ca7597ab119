"""The fair benchmark against `transformers`: `python -m specdec_ref.bench`.

* `pair`: what is measured: a model pair, a prompt set, the pair's pass costs c and v(K);
* `arms`: the ways of generating that are compared, and one instrumented run of each;
* `config`: what defines a run (`BenchConfig`, from the command line: `parse_args`);
* `run`: build the run, time the arms in a round-robin schedule, report
  (`summary.make_report`) and print its table;
* `methods`: the article's timing protocol next to a fair one, for one comparison.
* `vocab`: drafting with a draft that has its own tokenizer (chapter 9), timed on the tiny
  target: `python -m specdec_ref.bench.vocab`; `vocab_audit` audits it (ours and transformers'):
  `python -m specdec_ref.bench.vocab_audit`.

The chapters read the report (`bench.report.predicted_vs_measured`); besides the demo
(`python -m specdec_ref`), only the performance chapter imports this subpackage.
"""

from .run import BenchConfig, format_table, main, run_benchmark

__all__ = ["BenchConfig", "format_table", "main", "run_benchmark"]

"""Evaluation of linkers on gold mentions and of pipelines end to end.

* :mod:`.recall` -- GenBioEL's recall@k rule and the KB coverage of gold IDs;
* :mod:`.analysis` -- sub-populations (GenBioEL Table 9) and similarity bins (ANGEL Fig. 4);
* :mod:`.calibration` -- precision against coverage when abstaining below a score threshold;
* :mod:`.plots` -- the similarity-bin and calibration charts (the only module that uses matplotlib);
* :mod:`.report` -- :func:`evaluate_linker` and its :class:`EvaluationReport`;
* :mod:`.run` -- the ``evaluate`` command's workflow, :func:`run_evaluation`;
* :mod:`.end_to_end` -- NER + linking P/R/F1 on a pipeline's own entities.
"""

from spacy_genbioel.evaluation.analysis import (
    DEFAULT_BINS,
    SimilarityBin,
    SimilarityBins,
    SubpopulationRow,
    similarity_bins,
    subpopulation_table,
)
from spacy_genbioel.evaluation.calibration import (
    CalibrationCurve,
    CalibrationError,
    CalibrationPoint,
    calibration_curve,
    compare_calibrations,
    read_calibration,
    write_calibration,
)
from spacy_genbioel.evaluation.end_to_end import EndToEndReport, evaluate_end_to_end, run_end_to_end, score_end_to_end
from spacy_genbioel.evaluation.plots import plot_calibration, plot_similarity_bins
from spacy_genbioel.evaluation.recall import NO_GOLD_IDS, KBCoverage, RecallResult, gold_id_set, hit_rank, recall_at_k
from spacy_genbioel.evaluation.report import EvaluationReport, evaluate_linker, write_predictions
from spacy_genbioel.evaluation.run import (
    EvaluationSetupError,
    GoldOptions,
    ReportOutputs,
    check_component_settings,
    run_evaluation,
    write_report_json,
)

__all__ = [
    "CalibrationCurve",
    "CalibrationError",
    "CalibrationPoint",
    "calibration_curve",
    "compare_calibrations",
    "plot_calibration",
    "read_calibration",
    "write_calibration",
    "DEFAULT_BINS",
    "NO_GOLD_IDS",
    "EndToEndReport",
    "EvaluationReport",
    "EvaluationSetupError",
    "KBCoverage",
    "GoldOptions",
    "RecallResult",
    "ReportOutputs",
    "SimilarityBin",
    "SimilarityBins",
    "SubpopulationRow",
    "check_component_settings",
    "evaluate_end_to_end",
    "evaluate_linker",
    "gold_id_set",
    "hit_rank",
    "plot_similarity_bins",
    "recall_at_k",
    "run_end_to_end",
    "run_evaluation",
    "score_end_to_end",
    "similarity_bins",
    "subpopulation_table",
    "write_predictions",
    "write_report_json",
]

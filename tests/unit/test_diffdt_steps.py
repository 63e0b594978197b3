"""diffdt's steps around the library: config validation, the event sequences, the claim metrics, and the paper
profile's UK Biobank loader on local stand-ins."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import yaml

from tasks.common.params import ParamsError, validate_paper_section
from tasks.common.results import SeedResult
from tasks.diffdt import claim_metrics, data, sequences, ukb
from tasks.diffdt.config import UKBConfig
from tests.conftest import REPO

SECTION = yaml.safe_load((REPO / "params.yaml").read_text())["diffdt"]


def test_bad_params_name_the_key_and_the_reason():
    section = yaml.safe_load(yaml.safe_dump(SECTION))
    section["cpu"]["cohort"]["n_linked"] = section["cpu"]["cohort"]["n_codes"]
    with pytest.raises(ParamsError, match=r"diffdt\.cpu\.cohort.*n_linked"):
        validate_paper_section("diffdt", section)
    section = yaml.safe_load(yaml.safe_dump(SECTION))
    section["cpu"]["backbone"]["n_head"] = 5
    with pytest.raises(ParamsError, match=r"diffdt\.cpu\.backbone.*divisible"):
        validate_paper_section("diffdt", section)
    section = yaml.safe_load(yaml.safe_dump(SECTION))
    section["cpu"]["ukb"] = section["paper"]["ukb"]
    with pytest.raises(ParamsError, match="exactly one of cohort"):
        validate_paper_section("diffdt", section)


def hand_cohort() -> data.Cohort:
    nan = np.nan
    return data.Cohort(
        male=np.array([True, False]), baseline=np.array([52.0, 60.0]),
        sdoh_onset=np.array([[45.0, nan], [nan, nan]]),
        event_age=np.array([[48.0, nan, nan], [61.0, nan, 63.0]]),  # code 2 is death
        oracle_log_hazard=np.zeros((2, 3)), oracle_record_log_hazard=np.zeros((2, 3)),
        oracle_history_log_hazard=np.zeros((2, 3)),
        imaged={"brain": np.array([False, True]), "heart": np.array([True, False]),
                "liver": np.array([False, False]), "kidney": np.array([False, False])},
        traits={}, brain_c1=np.zeros((2, 2, 2)), brain_c2=np.zeros((2, 2, 2)), brain_dt=np.zeros(2),
        brain_follow=np.zeros(2, dtype=bool))


def test_sequences_by_hand():
    v = sequences.vocabulary(2, 3)
    tokens, ages = sequences.build_sequences(hand_cohort(), v, 10.0, with_sdoh=True, with_sensors=True,
                                             cut_at_baseline=False)
    # subject 0: male@40, SDoH0@45, no-event@45, disease0@48, no-event@50, baseline no-event@52, heart@52,
    # no-events@55, 60, end of follow-up @62
    assert tokens[0].tolist() == [v.MALE, v.sdoh(0), v.NO_EVENT, v.disease(0), v.NO_EVENT, v.NO_EVENT,
                                  v.sensor("heart"), v.NO_EVENT, v.NO_EVENT, v.NO_EVENT]
    assert ages[0, :10].tolist() == [40, 45, 45, 48, 50, 52, 52, 55, 60, 62]
    # subject 1 dies at 63: no end-of-follow-up token; padding at 60 and the baseline visit at 60, brain sensor
    assert tokens[1].tolist() == [v.FEMALE, v.NO_EVENT, v.NO_EVENT, v.NO_EVENT, v.NO_EVENT, v.NO_EVENT,
                                  v.sensor("brain"), v.disease(0), v.disease(2), 0]
    assert ages[1].tolist() == [40, 45, 50, 55, 60, 60, 60, 61, 63, 63]  # padding repeats the last age
    cut, cut_ages = sequences.build_sequences(hand_cohort(), v, 10.0, with_sdoh=False, with_sensors=False,
                                              cut_at_baseline=True, insert_sdoh=1)
    assert cut[0].tolist() == [v.MALE, v.NO_EVENT, v.disease(0), v.NO_EVENT, v.NO_EVENT]
    assert sequences.last_positions(cut).tolist() == [4, 4]
    edited, _ = sequences.build_sequences(hand_cohort(), v, 10.0, with_sdoh=True, with_sensors=False,
                                          cut_at_baseline=True, insert_sdoh=0)
    assert edited[0].tolist().count(v.sdoh(0)) == 1  # already present: not inserted twice
    assert edited[1].tolist()[-2:] == [v.sdoh(0), v.NO_EVENT]  # inserted at the baseline visit


def seed_result(true_positive_count: int = 8) -> SeedResult:
    return SeedResult(0).add(
        auc_delphi_linked=0.60, auc_delphi_other=0.62, auc_delphi_sdoh_linked=0.66, auc_delphi_sdoh_other=0.61,
        auc_diffdt_linked=0.70, auc_diffdt_other=0.64, auc_oracle_linked=0.75, auc_oracle_other=0.7,
        auc_oracle_record_linked=0.68, auc_oracle_history_linked=0.61,
        geometric_airm_error=1.0, euclidean_airm_error=4.0, no_change_airm_error=2.0, euclidean_frobenius_error=0.3,
        geometric_latent_floor_airm=0.5, euclidean_latent_floor_airm=1.6,
        no_change_frobenius_error=0.6, geometric_spd_valid_count=50, euclidean_spd_valid_count=40,
        brain_test_count=50, energy_heart_cond=0.1, energy_heart_uncond=0.2, energy_liver_cond=0.4,
        energy_liver_uncond=0.1, energy_kidney_cond=0.5, energy_kidney_uncond=0.5,
        intervention_agree_count=9, intervention_pair_count=12,
        intervention_true_positive_count=true_positive_count)


def test_claim_metrics_by_hand():
    out = claim_metrics.claim_metrics(None, seed_result())
    expected = {"auc_gain_linked_diffdt": 0.10, "auc_gain_other_diffdt": 0.02, "auc_gain_linked_sdoh": 0.06,
                "auc_gain_other_sdoh": -0.01, "delphi_other_above_chance": 0.12, "oracle_headroom_linked": 0.15,
                "sdoh_headroom_linked": 0.07,
                "airm_ratio_geometric_euclidean": 0.25, "euclidean_frobenius_over_no_change": 0.5,
                "geometric_airm_over_no_change": 0.5, "geometric_spd_valid_rate": 1.0,
                "euclidean_spd_invalid_count": 10, "euclidean_spd_invalid_rate": 0.2,
                "energy_ratio_cond_uncond": (0.5 * 4 * 1) ** (1 / 3), "intervention_sign_agreement": 0.75,
                "intervention_true_positive_share": 8 / 12,
                "geometric_airm_over_latent_floor": 2.0, "euclidean_airm_over_latent_floor": 2.5,
                "intervention_majority_sign_rate": 8 / 12, "intervention_agreement_over_majority": 0.75 - 8 / 12}
    assert set(out) == set(expected)
    for name, value in expected.items():
        assert out[name] == pytest.approx(value, abs=1e-12), name
    # a negative majority: 3 of 12 true effects positive, so the constant 'negative' predictor scores 0.75
    negative = claim_metrics.claim_metrics(None, seed_result(true_positive_count=3))
    assert negative["intervention_majority_sign_rate"] == pytest.approx(0.75)
    assert negative["intervention_agreement_over_majority"] == pytest.approx(0.0, abs=1e-12)
    assert math.isnan(claim_metrics.rate(1, 0)) and math.isnan(claim_metrics.geometric_mean([1.0, 0.0]))


def write_standins(tmp_path) -> UKBConfig:
    pl.DataFrame({"eid": [3, 1, 2], "male": [True, False, True], "baseline_age": [60.0, 55.0, 65.0]}).write_parquet(
        tmp_path / "people.parquet")
    pl.DataFrame({"eid": [1, 1, 1, 2, 2, 3, 3, 9],
                  "age": [50.0, 52.0, 51.0, 44.0, 70.0, 58.0, 61.0, 30.0],
                  "code": ["I10", "I109", "Z590", "W19", "DEATH", "E11", "I21", "I10"]}).write_parquet(
        tmp_path / "events.parquet")
    imaging = {"eid": [1, 3]}
    for organ, dim in {"heart": 8, "liver": 3, "kidney": 4}.items():
        imaging |= {f"{organ}_{d}": [float(d), None if organ == "liver" else 1.0] for d in range(dim)}
    pl.DataFrame(imaging).write_parquet(tmp_path / "imaging.parquet")
    eye = [1.0, 0.1, 1.0]  # 2 ROIs: upper triangle (c00, c01, c11)
    pl.DataFrame({"eid": [1, 1, 2], "visit": [0, 1, 0], "age": [55.0, 58.0, 65.0],
                  **{f"c_{d}": [eye[d], eye[d] * 1.1, eye[d]] for d in range(3)}}).write_parquet(
        tmp_path / "connectome.parquet")
    return UKBConfig(events_path=str(tmp_path / "events.parquet"), participants_path=str(tmp_path / "people.parquet"),
                     imaging_path=str(tmp_path / "imaging.parquet"),
                     connectome_path=str(tmp_path / "connectome.parquet"), n_codes=3, test_share=0.5, n_roi=2)


def test_ukb_loader_on_local_standins(tmp_path):
    frame = ukb.read_extracts(write_standins(tmp_path), seed=0)
    assert frame["eid"].to_list() == [1, 2, 3]
    events = np.asarray(frame["event_age"].to_list(), dtype=float)
    # codes kept: the 2 most frequent 3-character disease codes (I10 twice among participants... E11, I21 once;
    # ties broken alphabetically) and death
    assert events[0, 0] == 50.0  # I10 first occurrence (I109 at 52 is the same 3-character code)
    assert events[1, 2] == 70.0 and np.isnan(events[0, 2])  # death
    sdoh = np.asarray(frame["sdoh_onset"].to_list(), dtype=float)
    assert sdoh[0, ukb.SDOH_PREFIXES.index("Z59")] == 51.0 and sdoh[1, ukb.SDOH_PREFIXES.index("W")] == 44.0
    assert frame["imaged_heart"].to_list() == [True, False, True]
    assert frame["imaged_liver"].to_list() == [True, False, False]  # eid 3's liver IDPs are null
    assert frame["brain_follow"].to_list() == [True, False, False]
    assert frame["brain_dt"][0] == pytest.approx(3.0)
    path = tmp_path / "subjects_seed0.parquet"
    frame.write_parquet(path)
    train_rows = data.load_cohort(tmp_path, 0, "train")
    test_rows = data.load_cohort(tmp_path, 0, "test")
    assert train_rows.n + test_rows.n == 3 and train_rows.brain_c1.shape[1:] == (2, 2)


def test_upper_storage_round_trip():
    mats = np.array([[[1.0, 2.0], [2.0, 5.0]]])
    assert data.upper(mats).tolist() == [[1.0, 2.0, 5.0]]
    assert np.array_equal(data.from_upper(data.upper(mats), 2), mats)

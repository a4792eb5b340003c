-- The Optuna studies get their own database beside the tuning database (`tuning`): Optuna's
-- tables (one of them is `trials`) would collide with the tuning database's.
CREATE DATABASE studies;

#pragma once
// trainstudio --bench-dashboard: what the live dashboards cost the training.
int benchDashboard(int pairs, int epochs, const QString& databasePath);

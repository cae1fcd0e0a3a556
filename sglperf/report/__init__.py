"""What a reader sees: Allure results and the HTML report, plots, and drift over the history."""

"""Entry script of the viewer (``streamlit run viewer/app.py``; ``neuron-prof view`` does it)."""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from neuron_prof.viewer import data

VIEWS_DIR = Path(__file__).resolve().parent / "views"  # not pages/: Streamlit would also serve that as a legacy app
PAGES = (  # (page script, title, icon)
    ("overview", "Overview", ":material/dashboard:"),
    ("timeline", "Timeline", ":material/view_timeline:"),
    ("device", "Device", ":material/developer_board:"),
    ("compile", "Graph breaks / Compile", ":material/call_split:"),
    ("memory", "Memory", ":material/memory:"),
    ("collectives", "Collectives", ":material/hub:"),
    ("ops", "Ops", ":material/table_chart:"),
    ("compare", "Compare", ":material/compare_arrows:"),
)

st.set_page_config(page_title="neuron_prof", page_icon=":material/speed:", layout="wide")
nav = st.navigation([st.Page(VIEWS_DIR / f"{name}.py", title=title, icon=icon, url_path=name,
                             default=name == "overview") for name, title, icon in PAGES])
path = data.run_path()
with st.sidebar:
    st.caption("run")
    st.code(str(path), language=None)
nav.run()
